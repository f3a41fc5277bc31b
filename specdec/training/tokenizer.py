"""A byte-level BPE code tokenizer with FIM and repository-format special tokens."""

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

EOT = "<|endoftext|>"
FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX = "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"
FILE_SEP, REPO_NAME, FIM_PAD = "<|file_sep|>", "<|repo_name|>", "<|fim_pad|>"
SPECIAL_TOKENS = [EOT, FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, FIM_PAD, REPO_NAME, FILE_SEP]

# GPT-2's split, except that a newline with the indentation after it is one pre-token
# ("\n" + spaces), and runs of spaces stay together, so that BPE learns each common
# indentation depth as a single token.
_SPLIT = (
    r"\n[ \t]*(?=\S)|\n+|'(?:s|t|re|ve|m|ll|d)| ?\p{L}+| ?\p{N}{1,3}| ?[^\s\p{L}\p{N}]+| +(?=\S)| +|\s+"
)


def train_tokenizer(texts, vocab_size: int = 8192) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer
