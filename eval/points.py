"""Completion points: random cursor positions in a repository's source files, with their ground truth."""

import random
from dataclasses import dataclass
from pathlib import Path

SOURCE_SUFFIXES = (".py", ".js", ".ts", ".go", ".rs", ".java", ".c", ".cc", ".cpp", ".h")


@dataclass
class Point:
    path: str  # repository-relative
    prefix: str  # the file up to the cursor
    suffix: str  # the file after the ground truth
    truth: str  # what the completion should produce
    mode: str  # single | multi


def block_end(text: str, cursor: int, indent: int) -> int:
    """End of the block that starts at the cursor's line: before the first later line indented less."""
    pos = text.find("\n", cursor)
    while pos >= 0:
        nxt = text.find("\n", pos + 1)
        line = text[pos + 1 : nxt if nxt >= 0 else len(text)]
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            return pos
        if nxt < 0:
            return len(text)
        pos = nxt
    return len(text)


def sample_points(repo: Path, count: int, seed: int, mode: str = "auto", files=None) -> list[Point]:
    """`count` points; mid-line cursors get the rest of the line, line starts the rest of the block.

    mode single/multi forces one kind; auto mixes them as editors trigger (60% mid-line).
    """
    rng = random.Random(seed)
    files = files or sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")
                            if p.suffix in SOURCE_SUFFIXES and p.is_file() and "test" not in p.parts)
    points, attempts = [], 0
    while len(points) < count and attempts < count * 50:
        attempts += 1
        path = rng.choice(files)
        text = (repo / path).read_text(errors="replace")
        point = _point(text, path, rng, mode)
        if point is not None:
            points.append(point)
    return points


def _point(text: str, path: str, rng: random.Random, mode: str):
    lines = text.split("\n")
    code_rows = [i for i, line in enumerate(lines) if len(line.strip()) >= 8 and not line.strip().startswith(("#", "//"))]
    if len(code_rows) < 5:
        return None
    row = rng.choice(code_rows[2:])
    line = lines[row]
    start = sum(len(x) + 1 for x in lines[:row])
    indent = len(line) - len(line.lstrip())
    kind = mode if mode != "auto" else ("single" if rng.random() < 0.6 else "multi")
    if kind == "single":
        col = rng.randrange(indent + 1, len(line.rstrip()))
        cursor = start + col
        end = start + len(line)
        truth = text[cursor:end]
        return Point(path, text[:cursor], text[end:], truth, "single")
    cursor = start + indent
    end = block_end(text, cursor, indent)
    truth = text[cursor:end]
    if len(truth) > 400:  # keep blocks to what an inline completion shows
        cut = truth.rfind("\n", 0, 400)
        truth = truth[: cut if cut > 0 else 400]
        end = cursor + len(truth)
    return Point(path, text[:cursor], text[end:], truth, "multi")
