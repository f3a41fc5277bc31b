"""FIM and repository formats of the code-model families, recognised by their special tokens.

| family | prompt (PSM) | other order | context chunks |
| --- | --- | --- | --- |
| Qwen2.5/3-Coder, the embedded models | `<|fim_prefix|>P<|fim_suffix|>S<|fim_middle|>` | SPM `<|fim_prefix|><|fim_suffix|>S<|fim_middle|>P` | `<|repo_name|>name\\n`, then `<|file_sep|>path\\ncode\\n` per file, the cursor's file's `<|file_sep|>path\\n` before its FIM tokens |
| StarCoder2 | `<fim_prefix>P<fim_suffix>S<fim_middle>` | SPM, the same way | `<file_sep>path\\ncode` |
| DeepSeek-Coder | `<｜fim▁begin｜>P<｜fim▁hole｜>S<｜fim▁end｜>` | - | `# path` comment headers |
| Codestral | - | suffix first: `[SUFFIX]S[PREFIX]P` | `# path` comment headers |
| CodeLlama | `<s>▁<PRE>P▁<SUF>S▁<MID>` | SPM `<s>▁<PRE>▁<SUF>S▁<MID>P` | `# path` comment headers |

In every order but PSM the prefix ends the prompt, so it runs straight into the completion.
Qwen's repository layout is the one its technical report gives for repository-level FIM.
StarCoder2 names the cursor's file after `<fim_prefix>` instead, which is not built: its prompts
carry the chunks alone.
CodeLlama's tokenizer is a sentencepiece one, which puts a space before a text's first word:
the prefix keeps it (`<PRE> {prefix}` in Meta's reference code), the suffix is encoded without it.
"""

from dataclasses import dataclass


class FimFormatError(ValueError):
    """A tokenizer without the special tokens of any known FIM format, or an order it lacks."""


@dataclass(frozen=True)
class FimFormat:
    name: str
    prefix: str  # the token before the prefix (PSM) or the one that opens the prompt
    suffix: str
    middle: str | None  # None: the order has no middle token (Codestral)
    eot: tuple  # tokens that end a completion
    modes: tuple  # orders the family was trained on, the first its default
    file_sep: str | None = None  # repository-format separator; None: context as comment headers
    repo_name: str | None = None  # the token before the repository's name, where the format has one
    pad: str | None = None
    comment: str = "#"
    bos: str | None = None  # a token that opens every prompt (CodeLlama's <s>)
    bare_suffix: bool = False  # the suffix without the space a sentencepiece tokenizer puts first


    def tokens(self) -> tuple:
        return tuple(t for t in (self.prefix, self.suffix, self.middle, self.file_sep, self.repo_name, self.pad,
                                 *self.eot, self.bos) if t)


# SPM first for Qwen: typing appends to an SPM prompt, so a keystroke prefills only what was typed,
# where PSM prefills the whole suffix again; and Qwen2.5-Coder completes at least as well in it
# (bench/fim_order.py, docs/models.md).
QWEN = FimFormat("qwen", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", ("<|endoftext|>",), ("spm", "psm"),
                 file_sep="<|file_sep|>", repo_name="<|repo_name|>", pad="<|fim_pad|>")
STARCODER = FimFormat("starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", ("<|endoftext|>",), ("psm", "spm"),
                      file_sep="<file_sep>", pad="<fim_pad>")
DEEPSEEK = FimFormat("deepseek", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", ("<｜end▁of▁sentence｜>",), ("psm",))
CODESTRAL = FimFormat("codestral", "[PREFIX]", "[SUFFIX]", None, ("</s>",), ("suffix_first",))
CODELLAMA = FimFormat("codellama", "▁<PRE>", "▁<SUF>", "▁<MID>", ("▁<EOT>", "</s>"), ("psm", "spm"), bos="<s>",
                      bare_suffix=True)
FORMATS = (QWEN, STARCODER, DEEPSEEK, CODESTRAL, CODELLAMA)


def detect(tokenizer) -> FimFormat:
    """The format whose prefix, suffix and (when it has one) middle token the tokenizer holds."""
    for fmt in FORMATS:
        needed = [fmt.prefix, fmt.suffix] + ([fmt.middle] if fmt.middle else [])
        if all(tokenizer.token_to_id(t) is not None for t in needed):
            return fmt
    names = ", ".join(f"{f.name} ({f.prefix})" for f in FORMATS)
    raise FimFormatError(f"the tokenizer has none of the FIM formats' special tokens: {names}")


def order(fmt: FimFormat, mode: str | None) -> str:
    """The prompt order to use: `mode` when the family has it, else the family's default."""
    if mode is None:
        return fmt.modes[0]
    if mode not in fmt.modes:
        raise FimFormatError(f"fim mode {mode!r}: the {fmt.name} format has {', '.join(fmt.modes)}")
    return mode
