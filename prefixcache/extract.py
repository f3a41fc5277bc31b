"""Units of code that repeat, extracted from one file with its syntax tree.

A unit is a piece of one line that starts at a syntactic boundary: the statement itself
(the line after its indentation), and every call, member-access chain, constructor or path
that starts on the line, each also from after every dot in its chain. A unit ends at a
natural boundary: the end of the line or statement, a top-level comma or semicolon, or the
bracket that closes around it. Lines also record which line follows which, for proposals at
the start of a line.
"""

import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, getitem

from prefixcache import grammars

MAX_UNIT_CHARS = 96  # longer continuations are left to the draft model
MAX_LINE_BYTES = 1000  # lines longer than this are data or minified code, not units
_OPEN, _CLOSE = b"([{", b")]}"
_DOT_FIELD = re.compile(rb"\.\s*(?=[A-Za-z_$])")
_START, _SPAN = attrgetter("start_point"), attrgetter("start_point", "end_point")


@dataclass
class FileUnits:
    units: Counter = field(default_factory=Counter)  # unit text -> occurrences in the file
    follows: Counter = field(default_factory=Counter)  # (previous line, line) -> occurrences
    parsed: bool = False  # False: the line-based fallback was used


def extract(path: str, text: str) -> FileUnits:
    units, follow_at, parsed = occurrences(path, text)
    return FileUnits(Counter(units), Counter((units[i - 1], units[i]) for i in follow_at), parsed)


def occurrences(path: str, text: str) -> tuple[list, list, bool]:
    """(every unit occurrence, follow_at, parsed with a grammar): i in follow_at says that the
    line units[i] follows the line units[i - 1]. Positions rather than pairs of texts, so that a
    build counts follows with array indexing instead of two dict lookups per pair."""
    source = text.encode("utf-8", errors="replace")
    lines = source.split(b"\n")
    # Occurrences are collected in lists and counted at C speed afterwards.
    units, follow_at = [], []
    _line_units(lines, units, follow_at)
    parsed = False
    language = grammars.language_for(path)
    if language is not None:
        try:
            tree = grammars.parser(language).parse(source)
            _tree_units(language, tree, lines, units)
            parsed = True
        except (ValueError, RuntimeError):  # a grammar that cannot handle the file: lines only
            pass
    return units, follow_at, parsed


def _line_units(lines, units: list, follow_at: list) -> None:
    """Every non-blank line as a unit (these come first in units), and which follow which."""
    if max(map(len, lines), default=0) <= MAX_LINE_BYTES:  # no line breaks the chain: C-level maps only
        # The lines come from valid UTF-8 split at newlines, so a strict decode cannot fail.
        nonblank = list(map(bytes.decode, filter(None, map(bytes.strip, lines))))
        follow_at += range(len(units) + 1, len(units) + len(nonblank))
        units += map(getitem, nonblank, repeat(slice(MAX_UNIT_CHARS)))
        return
    follows_previous = False
    for raw in lines:
        if len(raw) > MAX_LINE_BYTES:
            follows_previous = False
            continue
        stripped = raw.strip()
        if not stripped:
            continue
        if follows_previous:
            follow_at.append(len(units))
        units.append(stripped.decode("utf-8", errors="replace")[:MAX_UNIT_CHARS])
        follows_previous = True


def _tree_units(language, tree, lines, units: list) -> None:
    found = grammars.captures(language, tree.root_node)
    starts = set(map(_START, found.get("unit", ())))  # one per (row, col): a chain's nodes share it
    opaque_rows = {start[0] for start, end in map(_SPAN, found.get("opaque", ())) if start[0] != end[0]}
    if opaque_rows:
        starts = [start for start in starts if start[0] not in opaque_rows]
    for row, col in starts:
        line = lines[row]
        if len(line) > MAX_LINE_BYTES or col == 0 or not line[:col].strip():
            continue  # the statement start is already a line unit
        end = unit_end(line, col)
        piece = line[col:end]
        _add(units, piece)
        for match in _DOT_FIELD.finditer(piece):
            _add(units, piece[match.end() :])


def _add(units: list, piece: bytes) -> None:
    piece = piece.rstrip()
    if len(piece) >= 2:
        units.append(piece.decode("utf-8", errors="replace")[:MAX_UNIT_CHARS])


_DELIMITER = re.compile(rb"[()\[\]{},;]")


def unit_end(line: bytes, start: int) -> int:
    """Where a unit that starts at `start` ends: a top-level , or ; the closing bracket around it, or the line end."""
    depth = 0
    for match in _DELIMITER.finditer(line, start):  # only the delimiters, not every byte
        c = line[match.start()]
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth < 0:
                return match.start()
        elif depth == 0:
            return match.start()
    return len(line)
