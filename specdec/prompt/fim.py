"""Prompt assembly for fill-in-the-middle: FIM order per model, repository context, token healing.

Formats (the embedded models are trained on both orders; `fim_mode` in config.json says which
to prefer; SPM is the default because typing only appends to its prompt, so the prompt cache
stays valid keystroke after keystroke):
  context  <|file_sep|>{filename}\n{text}    for each extra chunk, before the file
  PSM      <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>
  SPM      <|fim_prefix|><|fim_suffix|>{suffix}<|fim_middle|>{prefix}
Token healing: the word being typed is taken back out of the prompt (or, when the prefix ends
in whitespace, the whitespace tokens whose boundaries depend on what follows), and the generated
text must start with the text taken out. A cursor inside a word (`redis_cl|`) or after
indentation (`\n    |`) then does not force the model to continue from a token boundary it never
saw. Tokenizers split an indentation differently: the embedded one as `\n    ` + `word`, Qwen's as
`\n` + `   ` + ` word`, the indentation's last space joined to the word. So the healed text may
be spelled by several tokens: see Healing.
"""

import bisect
import zlib
from dataclasses import dataclass, field

import torch

from specdec.prompt.detokenize import token_bytes
from specdec.prompt.fim_formats import FimFormat, FimFormatError, detect, order
from specdec.prompt.tokencache import TokenCache

MAX_CONTEXT_TOKENS = 1536  # of the model's 2048 positions, leaving room to generate
CHARS_PER_TOKEN_MAX = 6  # code averages 3.7 characters per token with the default tokenizer
LINE_ALLOWANCE = 96  # tokens of a cut prefix's budget kept for the line being typed
MAX_HEALED_TOKENS = 4  # a word being typed rarely spans more tokens than this
FIXED_TOKENS = 5  # the format's special tokens around prefix and suffix, and a BOS where the family has one
_SENTINEL = "\u263a"  # a character no merge joins to the text after it (Meta's reference code uses it too)
ANCHOR_EVERY = 8  # about one line in this many is a place where a too-long prefix may be cut
# What may follow a whitespace tail: a word, a deeper indentation, punctuation, a number. A token
# of the tail stays in the prompt only where each of them tokenizes it the same way.
WHITESPACE_PROBES = ("a", "    a", "(", "1")


class PromptError(ValueError):
    """A prompt this model cannot take (e.g. a tokenizer without FIM tokens)."""


class Healing:
    """Token healing's hold on the completion: its text must begin with `left`, the text taken
    out of the prompt and not generated yet. The next token may spell all of `left` and go on,
    or only a first part of it, and then the rest holds the token after it: a tokenizer that
    splits the healed `\n        ` as `\n`, 7 spaces, ` word` takes that path, one token at a time.
    Each kind is a token the tokenizer gives some text, so the model is never forced off the
    splits it was trained on."""

    __slots__ = ("left", "allowed", "_builder")

    def __init__(self, builder: "PromptBuilder", left: str):
        self.left, self._builder = left, builder
        self.allowed = torch.as_tensor(builder.tokens_starting_with(left) + builder.tokens_spelling_part_of(left),
                                       dtype=torch.long)  # never empty: a text's first character is a token

    def allows(self, token: int) -> bool:
        text = self._builder.vocab_text[token]
        return token not in self._builder.stop_ids and bool(text) and (
            text.startswith(self.left) or self.left.startswith(text))

    def after(self, token: int) -> "Healing | None":
        """What holds the token after `token` (one this healing allows): None once all is spelled."""
        spelled = len(self._builder.vocab_text[token])
        return self._builder.healing(self.left[spelled:]) if spelled < len(self.left) else None


@dataclass
class Prompt:
    ids: list[int]  # the tokens to prefill
    healed_text: str  # text taken back out of the prompt by token healing ("" if none)
    healing: Healing | None = field(compare=False)  # what healed_text asks of the first generated tokens
    truncated: bool  # context or prefix had to be cut to fit
    context_chunks: int = 0  # chunks that went into the prompt
    context_tokens: int = 0


def token_texts(tokenizer) -> list[str]:
    """Each token's text as it reads after other text. A sentencepiece decoder drops the space
    of a text's first word (`▁return` alone decodes to `return`), which healing must keep: each
    token is decoded after an anchor token, and the anchor's own text is cut off. (A byte-level
    BPE decodes the same either way.)"""
    anchor = tokenizer.encode("a", add_special_tokens=False).ids[-1:]
    head = tokenizer.decode(anchor, skip_special_tokens=False)
    size = tokenizer.get_vocab_size()
    after = tokenizer.decode_batch([anchor + [i] for i in range(size)], skip_special_tokens=False)
    return [text[len(head):] if text.startswith(head) else tokenizer.decode([i], skip_special_tokens=False)
            for i, text in enumerate(after)]


class PromptBuilder:
    def __init__(self, tokenizer, fim_mode: str | None = "spm", max_tokens: int = MAX_CONTEXT_TOKENS,
                 fim_format: FimFormat | None = None):
        """fim_format: the family's format (default: recognised from the tokenizer's special
        tokens); fim_mode: psm, spm or suffix_first, None for the family's default order."""
        self.tokenizer = tokenizer
        try:
            self.format = fim_format or detect(tokenizer)
            self.fim_mode = order(self.format, fim_mode)
        except FimFormatError as err:
            raise PromptError(str(err)) from None
        self.max_tokens = max_tokens
        self.pieces = TokenCache(tokenizer)  # the prompt's suffix, chunks and lines above the cursor
        ids = {t: tokenizer.token_to_id(t) for t in self.format.tokens()}
        self.special = {t: i for t, i in ids.items() if i is not None}  # the format's optional ones may be absent
        if self.format.eot[0] not in self.special:
            raise PromptError(f"tokenizer lacks the special tokens {[self.format.eot[0]]}")
        self.vocab_text = token_texts(tokenizer)
        self.token_bytes = token_bytes(tokenizer, self.vocab_text)  # for TextStream: None where decoding is not bytes end to end
        self.stop_ids = set(self.special.values())  # every special token of the format ends a completion
        # A single-line completion ends at the first of these (a newline in its text).
        self.newline_ids = frozenset(i for i, text in enumerate(self.vocab_text) if "\n" in text)
        # Token texts in sorted order: the tokens that start with a text form one range of it.
        ranked = sorted((t, i) for i, t in enumerate(self.vocab_text) if i not in self.stop_ids)
        self._sorted_text = [t for t, _ in ranked]
        self._sorted_ids = [i for _, i in ranked]
        self._healings: dict[str, Healing] = {}

    def encode(self, text: str) -> list[int]:
        return self._encoding(text).ids if text else []

    def _suffix_within(self, suffix: str, budget: int) -> tuple:
        """The suffix's tokens, or, for a suffix far longer than the budget, only the first of
        them: more than the budget, so that it does not fit either way, and all that is kept of
        it (a quarter of the budget at most). The rest of a long file is not tokenized at all."""
        if not self.format.bare_suffix:
            head = self.pieces.encode_head(suffix, CHARS_PER_TOKEN_MAX * (budget + 1))
            if head is not None and len(head[0]) > budget:
                return head[0]
        return self._encode_suffix(suffix)

    def _encode_suffix(self, text: str) -> tuple:
        """The suffix's tokens; for a sentencepiece family, without the space its tokenizer puts
        before the first word: encoded after a sentinel, whose own tokens are dropped."""
        if not text:
            return []
        if not self.format.bare_suffix:
            return self.pieces.encode(text)[0]
        head = tuple(self.encode(_SENTINEL))
        ids = self.pieces.encode(_SENTINEL + text)[0]
        return ids[len(head) :] if ids[: len(head)] == head else ids

    def build(self, prefix: str, suffix: str = "", extra=(), path: str | None = None, heal: bool = True,
              reserve: int = 0, fim_mode: str | None = None, repo: str | None = None) -> Prompt:
        """reserve: tokens kept for the context chunks however long the file is (a fixed number,
        so that the prefix's cut, and with it the prompt cache, stays put keystroke after keystroke);
        fim_mode: this prompt's order, one the family has (checked at submit), None for the builder's;
        repo and path: the repository's name and the file's path in it, for the family's repository
        format (Qwen2.5-Coder's `<|repo_name|>name` line first, then `<|file_sep|>path` before the
        file's own FIM tokens), where the family has its tokens; None leaves that header out."""
        opening, file_header = self._repository_header(repo, path)
        fixed = FIXED_TOKENS + len(opening) + len(file_header)
        budget = self.max_tokens - fixed - min(reserve, self.max_tokens // 2)
        suffix_ids = self._suffix_within(suffix, budget)
        keep_suffix = min(len(suffix_ids), budget // 4)
        prefix_ids, truncated, sized_by = self._prefix_within(prefix, budget - keep_suffix, budget - len(suffix_ids))
        if truncated:
            suffix_ids = suffix_ids[:keep_suffix]
        healed = ""
        if heal and prefix_ids:
            prefix_ids, healed = self._heal(prefix_ids)
        room = self.max_tokens - fixed - len(prefix_ids) - len(suffix_ids)
        # The context's room is sized as the cut is, from the lines above the cursor's, in steps
        # of 128 tokens: the room left by the prefix's own tokens would shrink keystroke by
        # keystroke and drop a chunk at the prompt's front, which is a prefill of the whole prompt.
        steady = self.max_tokens - fixed - len(suffix_ids) - -(-sized_by // 128) * 128
        context = self._context(extra, min(room, max(reserve, steady)))
        truncated |= context[1]
        bos = [self.special[self.format.bos]] if self.format.bos in self.special else []
        ordered = self._ordered(prefix_ids, suffix_ids, fim_mode or self.fim_mode)
        return Prompt(bos + opening + context[0] + file_header + ordered, healed, self.healing(healed), truncated,
                      context[2], len(context[0]))

    def _repository_header(self, repo: str | None, path: str | None) -> tuple[list[int], list[int]]:
        """(the `<|repo_name|>name` line, the `<|file_sep|>path` line) of the repository format;
        each empty where its name is None, and both where the family has no such layout."""
        fmt, special = self.format, self.special
        if fmt.repo_name not in special or fmt.file_sep not in special:
            return [], []
        opening = [special[fmt.repo_name], *self.encode(f"{repo}\n")] if repo else []
        file_header = [special[fmt.file_sep], *self.encode(f"{path}\n")] if path else []
        return opening, file_header

    def _ordered(self, prefix_ids: list[int], suffix_ids: list[int], fim_mode: str) -> list[int]:
        fmt, sp = self.format, self.special
        if fim_mode == "psm":
            return [sp[fmt.prefix], *prefix_ids, sp[fmt.suffix], *suffix_ids, sp[fmt.middle]]
        if fim_mode == "suffix_first":
            return [sp[fmt.suffix], *suffix_ids, sp[fmt.prefix], *prefix_ids]
        return [sp[fmt.prefix], sp[fmt.suffix], *suffix_ids, sp[fmt.middle], *prefix_ids]

    def _prefix_within(self, prefix: str, keep: int, fits: int) -> tuple[list[int], bool, int]:
        """(tokens, truncated, tokens the cut was sized by) of the prefix, cut at the front when
        it does not fit `fits` tokens; a cut prefix keeps at most `keep` tokens.

        The cut is made at an anchor line (chosen by a hash of the line's text), never at a
        fixed token count from the cursor: a window that slid by one token per keystroke would
        change every prompt token after the cut, and the prompt cache would prefill the whole
        prefix again on each keystroke. An anchor stays put while the user types, and so does a
        client's window that drops whole lines at its front (llama.vim's 256 lines).

        The cut is sized by the complete lines before the cursor's line, with LINE_ALLOWANCE
        tokens left for the line being typed: the token count of that line goes up and down as
        its last word merges and splits (`retu` is two tokens, `return` one), and a cut sized by
        it would swing between two anchors on alternate keystrokes, each swing a prefill of the
        whole prefix. Sized so, the cut moves only when a line is added above the cursor, and
        not on the keystroke that adds it (see settled_newline).
        """
        window = _line_start_at_or_after(prefix, len(prefix) - CHARS_PER_TOKEN_MAX * (max(keep, fits) + LINE_ALLOWANCE))
        text = prefix[window:]
        ids, offsets = self.pieces.encode_before_cursor(text)
        if window > 0 and len(ids) < max(keep, fits) + LINE_ALLOWANCE:
            window, text = 0, prefix
            ids, offsets = self.pieces.encode_before_cursor(text)
        above = bisect.bisect_left(offsets, (settled_newline(text), -1))  # tokens of the settled lines
        if window == 0 and above + LINE_ALLOWANCE <= fits and len(ids) <= fits:
            return ids, False, above + LINE_ALLOWANCE
        target = max(0, min(keep - LINE_ALLOWANCE, above))
        cut = _anchor_at_or_after(text, offsets[above - target][0] if target else len(text))
        while cut is not None:
            # Tokens from the anchor line's newline on: pre-tokenization splits there, so they
            # are what tokenizing the text from that point alone gives, whatever lies before it.
            first = bisect.bisect_left(offsets, (max(cut - 1, 0), -1))
            if len(ids) - first <= keep:  # fails only for a line being typed past its allowance
                return ids[first:], True, max(above - first, 0) + LINE_ALLOWANCE
            later = _anchor_at_or_after(text, _line_start_at_or_after(text, cut + 1))
            cut = later if later is not None and later > cut else None
        # No line start in reach (one huge line): a plain token cut.
        return ids[max(0, len(ids) - keep) :], True, keep

    def _encoding(self, text: str):
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _heal(self, ids: list[int]) -> tuple[list[int], str]:
        """(ids without the healed tail, the tail's text)."""
        back = 0
        while back < min(MAX_HEALED_TOKENS, len(ids)) and not self.vocab_text[ids[-1 - back]].strip():
            back += 1
        if back:
            kept = len(ids) - back + self._settled_whitespace(ids[len(ids) - back :])
            return ids[:kept], "".join(self.vocab_text[i] for i in ids[kept:])
        for count in range(self._word_tail(ids), 0, -1):  # the longest tail that some single token still covers
            text = "".join(self.vocab_text[i] for i in ids[len(ids) - count :])
            if self.tokens_starting_with(text):
                return ids[: len(ids) - count], text
        return ids, ""

    def _settled_whitespace(self, tail: list[int]) -> int:
        """How many of a whitespace tail's first tokens every probe continuation tokenizes the
        same way (Qwen's `\n` before an indentation); the rest depend on what is typed next."""
        text, settled = "".join(self.vocab_text[i] for i in tail), len(tail)
        for probe in WHITESPACE_PROBES:
            ids = self.encode(text + probe)
            same = 0
            while same < settled and same < len(ids) and ids[same] == tail[same]:
                same += 1
            settled = same
        return settled

    def _word_tail(self, ids: list[int]) -> int:
        """How many final tokens spell the word being typed (`ret`+`u` of `retu`), at least 1.

        Healing one token would leave `ret` in the prompt, a split training text never shows
        before `return`, and the model then continues an identifier `retu...` instead."""
        count = 0
        while count < min(MAX_HEALED_TOKENS, len(ids)):
            piece = self.vocab_text[ids[-1 - count]]
            core = piece[1:] if piece[:1] == " " else piece
            if not core or not (core.replace("_", "a").isalnum()):
                break
            count += 1
            if core is not piece:  # a leading space starts the word
                break
        return max(1, count)

    def healing(self, text: str) -> Healing | None:
        """The hold of a healed text on the completion (None for no text), made once per text."""
        if not text:
            return None
        healing = self._healings.get(text)
        if healing is None:
            if len(self._healings) >= 1024:  # healed texts are short tails; this bounds odd inputs
                self._healings.clear()
            healing = self._healings[text] = Healing(self, text)
        return healing

    def tokens_spelling_part_of(self, text: str) -> list[int]:
        """Ids of the (non-special) tokens whose text is a first part of `text`, shorter than it."""
        ids = []
        for end in range(1, len(text)):
            lo = bisect.bisect_left(self._sorted_text, text[:end])
            hi = bisect.bisect_right(self._sorted_text, text[:end], lo)
            ids += self._sorted_ids[lo:hi]
        return ids

    def tokens_starting_with(self, text: str) -> list[int]:
        """Ids of the (non-special) tokens whose text starts with `text`, in sorted-text order."""
        lo = bisect.bisect_left(self._sorted_text, text)
        hi = bisect.bisect_left(self._sorted_text, text + "\U0010ffff", lo)
        return self._sorted_ids[lo:hi]

    def _context(self, extra, budget: int):
        """Context chunks, most recent last (nearest the file), dropped from the front to fit."""
        chunks, separator = [], self.special.get(self.format.file_sep)
        for item in extra:
            filename, text = (item["filename"], item["text"]) if isinstance(item, dict) else item
            if separator is not None:  # each file's text ends in a newline before the next separator
                ending = "" if text.endswith("\n") else "\n"
                chunks.append([separator, *self.pieces.encode(f"{filename}\n{text}{ending}")[0]])
            else:  # a family without repository tokens reads a path comment before each chunk
                chunks.append(list(self.pieces.encode(f"{self.format.comment} {filename}\n{text}\n")[0]))
        out, truncated, kept = [], False, 0
        for chunk in reversed(chunks):
            if len(out) + len(chunk) > budget:
                truncated = True
                break
            out = chunk + out
            kept += 1
        return out, truncated, kept


def settled_newline(text: str) -> int:
    """Where the lines that size the prompt's layout (the prefix's cut, the context's room and
    which context is chosen) end: the newline before the cursor's line, or, while the cursor's
    line is still blank (Enter was just pressed, perhaps with an indent, perhaps more than once),
    the one before the last line that is not blank. -1: no such line.

    Enter is the keystroke after which users pause and wait for a suggestion. Counted at once,
    the line it completes would move the cut or refresh the context on exactly that request,
    a prefill of most of the prompt while the user waits; counted from the new line's first
    character, the change lands on a keystroke of a burst, whose prefill goes on as the user
    types the line (the prompt cache keeps what a superseded request prefilled)."""
    last = text.rfind("\n")
    if last >= 0 and not text[last + 1 :].strip():
        return text.rstrip().rfind("\n")
    return last


def _line_start_at_or_after(text: str, position: int) -> int:
    if position <= 0:
        return 0
    newline = text.find("\n", position - 1)
    return 0 if newline < 0 else newline + 1


def _anchor_at_or_after(text: str, start: int) -> int | None:
    """The first anchor line start (one non-blank line in about ANCHOR_EVERY, by a hash of its
    text) at or after `start`; the first line start if no anchor is near; None if no line starts
    there."""
    line = _line_start_at_or_after(text, start)
    if line == 0 and start > 0:
        return None
    first = line
    for _ in range(16 * ANCHOR_EVERY):
        end = text.find("\n", line)
        if end < 0:
            break
        body = text[line:end]
        # Blank lines are no anchors: they all hash alike, and code has one every few lines.
        if body.strip() and zlib.crc32(body.encode("utf-8", "surrogatepass")) % ANCHOR_EVERY == 0:
            return line
        line = end + 1
    return first
