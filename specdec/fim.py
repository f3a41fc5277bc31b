"""Prompt assembly for fill-in-the-middle: FIM order per model, repository context, token healing.

Formats (the embedded models are trained on both orders; `fim_mode` in config.json says which
to prefer; SPM is the default because typing only appends to its prompt, so the prompt cache
stays valid keystroke after keystroke):
  context  <|file_sep|>{filename}\n{text}    for each extra chunk, before the file
  PSM      <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>
  SPM      <|fim_prefix|><|fim_suffix|>{suffix}<|fim_middle|>{prefix}
Token healing: the prefix's last token is taken back out of the prompt (or, when the prefix
ends in whitespace, all its trailing whitespace tokens), and the first generated token must start
with the text taken out. A cursor inside a word (`redis_cl|`) or after indentation (`\n    |`,
which training text always tokenizes together with the next word's newline) then does not force
the model to continue from a token boundary it never saw.
"""

from dataclasses import dataclass

FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX = "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"
FILE_SEP, EOT = "<|file_sep|>", "<|endoftext|>"
MAX_CONTEXT_TOKENS = 1536  # of the model's 2048 positions, leaving room to generate


class PromptError(ValueError):
    """A prompt this model cannot take (e.g. a tokenizer without FIM tokens)."""


@dataclass
class Prompt:
    ids: list[int]  # the tokens to prefill
    healed_text: str  # text taken back out of the prompt by token healing ("" if none)
    allowed_first: list[int] | None  # token ids allowed as the first generated token (healing)
    truncated: bool  # context or prefix had to be cut to fit


class PromptBuilder:
    def __init__(self, tokenizer, fim_mode: str = "spm", max_tokens: int = MAX_CONTEXT_TOKENS):
        self.tokenizer = tokenizer
        self.fim_mode = fim_mode
        self.max_tokens = max_tokens
        self.special = {t: tokenizer.token_to_id(t) for t in (FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, FILE_SEP, EOT)}
        if any(v is None for v in self.special.values()):
            missing = [t for t, v in self.special.items() if v is None]
            raise PromptError(f"tokenizer lacks the special tokens {missing}")
        self.vocab_text = [tokenizer.decode([i], skip_special_tokens=False) for i in range(tokenizer.get_vocab_size())]
        self.stop_ids = {self.special[t] for t in (EOT, FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, FILE_SEP)}

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids if text else []

    def build(self, prefix: str, suffix: str = "", extra=(), path: str | None = None, heal: bool = True) -> Prompt:
        sp = self.special
        prefix_ids, suffix_ids = self.encode(prefix), self.encode(suffix)
        healed, allowed = "", None
        if heal and prefix_ids:
            prefix_ids, healed, allowed = self._heal(prefix_ids)
        budget = self.max_tokens - 4
        truncated = False
        if len(prefix_ids) + len(suffix_ids) > budget:  # keep the text nearest the cursor
            truncated = True
            keep_suffix = min(len(suffix_ids), budget // 4)
            suffix_ids = suffix_ids[:keep_suffix]
            prefix_ids = prefix_ids[len(prefix_ids) - (budget - keep_suffix) :]
        context = self._context(extra, budget - len(prefix_ids) - len(suffix_ids))
        truncated |= context[1]
        if self.fim_mode == "psm":
            ids = [sp[FIM_PREFIX], *prefix_ids, sp[FIM_SUFFIX], *suffix_ids, sp[FIM_MIDDLE]]
        else:
            ids = [sp[FIM_PREFIX], sp[FIM_SUFFIX], *suffix_ids, sp[FIM_MIDDLE], *prefix_ids]
        return Prompt(context[0] + ids, healed, allowed, truncated)

    def _heal(self, ids: list[int]):
        """(ids without the healed tail, the tail's text, tokens allowed to start the completion)."""
        back = 0
        while back < min(4, len(ids)) and not self.vocab_text[ids[-1 - back]].strip():
            back += 1
        for count in ((back, 1) if back else (1,)):
            text = "".join(self.vocab_text[i] for i in ids[len(ids) - count :])
            allowed = [i for i, t in enumerate(self.vocab_text) if t.startswith(text) and i not in self.stop_ids]
            if allowed:
                return ids[: len(ids) - count], text, allowed
        return ids, "", None

    def _context(self, extra, budget: int):
        """Context chunks, most recent last (nearest the file), dropped from the front to fit."""
        chunks = []
        for item in extra:
            filename, text = (item["filename"], item["text"]) if isinstance(item, dict) else item
            chunks.append([self.special[FILE_SEP], *self.encode(f"{filename}\n{text}")])
        out, truncated = [], False
        for chunk in reversed(chunks):
            if len(out) + len(chunk) > budget:
                truncated = True
                break
            out = chunk + out
        return out, truncated
