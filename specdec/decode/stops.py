"""Stop rules for inline completion, applied to the text generated so far.

Each rule returns where to cut the text (or None): single-line mode ends at the first newline;
multi-line mode ends before the first line indented less than the cursor's block (llama.cpp's
n_indent); the output stops where it starts repeating the text after the cursor, or repeats its
own previous line (small models loop); explicit stop strings cut before themselves.
"""

from dataclasses import dataclass, field
from typing import NamedTuple


class StopCut(NamedTuple):
    """Where the text ends and why; `matched` names the stop string when reason is "word"."""

    position: int | None
    reason: str | None
    matched: str = ""


NO_CUT = StopCut(None, None)


@dataclass
class StopRules:
    single_line: bool
    min_indent: int = 0  # a later line indented less than this ends a multi-line completion
    suffix_first_line: str = ""  # rest of the cursor line after the cursor
    suffix_next_line: str = ""  # first non-empty line after the cursor line, stripped
    stop_strings: list = field(default_factory=list)

    def cut(self, text: str) -> StopCut:
        """The earliest rule that fires, else NO_CUT."""
        best = NO_CUT
        for found in (self._line(text), self._dedent(text), self._suffix(text), self._repeat(text),
                      self._strings(text)):
            if found[0] is not None and (best.position is None or found[0] < best.position):
                best = StopCut(*found)
        return best

    def _line(self, text):
        if self.single_line:
            nl = text.find("\n")
            if nl >= 0:
                return nl, "newline"
        return None, None

    def _dedent(self, text):
        if self.single_line:
            return None, None
        start = text.find("\n")
        while start >= 0:
            end = text.find("\n", start + 1)
            # the last line counts as soon as it has a character other than indentation: its
            # indentation is final then, and decoding stops at that token, not a line later
            line = text[start + 1 : end if end >= 0 else len(text)]
            if line.strip() and len(line) - len(line.lstrip()) < self.min_indent:
                return start, "dedent"
            start = end
        return None, None

    def _suffix(self, text):
        tail = self.suffix_first_line.strip()
        if tail and self.single_line and text.rstrip().endswith(tail) and text.strip():
            cut = text.rstrip()[: -len(tail)]
            return len(cut), "suffix"
        nxt = self.suffix_next_line
        if nxt and not self.single_line:
            start = 0
            while True:
                end = text.find("\n", start)
                if end < 0:
                    break
                if text[start:end].strip() == nxt and start > 0:
                    return start - 1, "suffix"
                start = end + 1
        return None, None

    def _repeat(self, text):
        """A complete line equal to the complete line before it (and not trivially short)."""
        if self.single_line:
            return None, None
        lines = text.split("\n")[:-1]  # the last piece may still grow
        offset = 0
        for i, line in enumerate(lines):
            if i and len(line.strip()) > 3 and line == lines[i - 1]:
                return offset - 1, "repeat"
            offset += len(line) + 1
        return None, None

    def _strings(self, text):
        """The stop string found first in the text (the longest when two start at one place)."""
        hits = [(text.find(s), -len(s), s) for s in self.stop_strings if s and s in text]
        if not hits:
            return None, None
        position, _, matched = min(hits)
        return position, "word", matched


def rules_for(prefix: str, suffix: str, mode: str, n_indent: int | None = None, stop=()) -> StopRules:
    """mode: single | multi | auto (single when text follows the cursor on its line)."""
    line_start = prefix[prefix.rfind("\n") + 1 :]
    first_line, _, rest = suffix.partition("\n")
    if mode == "auto":
        mode = "single" if first_line.strip() else "multi"
    indent = len(line_start) - len(line_start.lstrip())
    if n_indent is not None and n_indent > 0:
        indent = n_indent
    next_line = next((line.strip() for line in rest.split("\n") if line.strip()), "")
    return StopRules(single_line=mode == "single", min_indent=indent, suffix_first_line=first_line,
                     suffix_next_line=next_line, stop_strings=list(stop or ()))


class Output:
    """A completion's generated tokens and their text as they arrive, and where its stop rules
    cut that text. The text starts after the prompt's healed characters, which the first
    tokens spell again (healed_chars, set once the prompt is built)."""

    def __init__(self, rules: StopRules, stream):
        self.rules, self.stream = rules, stream  # stream: detokenize.TextStream
        self.healed_chars = 0
        self.generated: list[int] = []
        self.text, self.final_text = "", None

    def append(self, token: int) -> StopCut:
        """Add one token; the cut of the rule that fires first, else NO_CUT."""
        self.generated.append(token)
        self.text = self.stream.append(token)[self.healed_chars :]
        cut = self.rules.cut(self.text)
        if cut.position is not None:
            self.final_text = self.text[: cut.position]
        return cut

    def current_text(self) -> str:
        """The text as answered: cut where a stop rule fired, else all of it so far."""
        return self.final_text if self.final_text is not None else self.text
