"""A `tokenizers.Tokenizer` built from a GGUF file's vocabulary (byte-level BPE, as Qwen and Llama 3 use).

The file stores the tokens, their types and the merges, and names its pre-tokenizer
(`tokenizer.ggml.pre`): the regular expression that splits text before the merges apply. Tokens
typed control (`<|endoftext|>`, the FIM tokens) or user-defined are matched whole, as llama.cpp
matches them, and control tokens are special (dropped when decoding with skip_special_tokens).
"""

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from specdec.models.config import ConfigError

# The splits of the two byte-level families we serve, as their tokenizer.json files give them.
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {"qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
          "llama3": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT}
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types


def tokenizer_from_gguf(checkpoint) -> Tokenizer:
    """The tokenizer of a GgufCheckpoint; a ConfigError names what the file lacks or what is unsupported."""
    kind = checkpoint.value("tokenizer.ggml.model")
    tokens = checkpoint.value("tokenizer.ggml.tokens")
    if kind != "gpt2" or not tokens:
        raise ConfigError(f"{checkpoint.path}: GGUF tokenizer {kind!r} is not supported (byte-level BPE, 'gpt2', is)")
    pre = checkpoint.value("tokenizer.ggml.pre", "default")
    if pre not in SPLITS:
        raise ConfigError(f"{checkpoint.path}: GGUF pre-tokenizer {pre!r} is not supported; "
                          f"supported: {', '.join(sorted(SPLITS))}")
    merges = [tuple(merge.split(" ", 1)) for merge in checkpoint.value("tokenizer.ggml.merges") or ()]
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=SPLITS[pre] is _LLAMA3_SPLIT))  # as Llama 3's tokenizer.json sets it
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLITS[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    _add_whole_tokens(tokenizer, tokens, checkpoint.value("tokenizer.ggml.token_type") or ())
    return tokenizer


def _add_whole_tokens(tokenizer: Tokenizer, tokens: list, types) -> None:
    typed = list(zip(tokens, types, strict=False))  # a file without types has no whole tokens
    special = [AddedToken(t, special=True, normalized=False) for t, k in typed if k == CONTROL]
    plain = [AddedToken(t, special=False, normalized=False) for t, k in typed if k == USER_DEFINED]
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens(plain)
