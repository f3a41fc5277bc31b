"""Which files of a repository get indexed, and why the others are skipped."""

import fnmatch
import os
import subprocess
from collections import Counter
from pathlib import Path

MAX_FILE_BYTES = 2_000_000  # bigger files are generated or data
MAX_LINE_CHARS = 1000  # a longer line means minified or vendored code
SNIFF_BYTES = 8192
SKIPPED_DIRS = {".git", "node_modules", "__pycache__", ".venv", "venv", ".tox", "dist", "build", "vendor"}


def list_files(root: Path, exclude: tuple = ()) -> list[str]:
    """Candidate paths relative to root, POSIX style: `git ls-files` in a work tree, else a walk honouring .gitignore.

    exclude: glob patterns matched against the relative path and each of its directories.
    """
    tracked = _git_files(root)
    if not tracked:  # not a work tree, or ignored by an outer one
        return _walk(root, exclude)
    return [p for p in tracked if not _excluded(p, exclude)] if exclude else tracked


def _excluded(rel: str, patterns) -> bool:
    """True when the path, or one of its directories (by name or by path), matches a pattern."""
    parts = rel.split("/")
    candidates = {rel, *parts[:-1], *("/".join(parts[: i + 1]) for i in range(len(parts) - 1))}
    return any(fnmatch.fnmatchcase(c, p) for p in patterns for c in candidates)


def _git_files(root: Path) -> list[str] | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True, timeout=60, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    prefix = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-prefix"], capture_output=True, text=True).stdout.strip()
    paths = [p.decode("utf-8", "replace") for p in out.split(b"\0") if p]
    return sorted(p[len(prefix):] if prefix and p.startswith(prefix) else p for p in paths)


def _walk(root: Path, exclude: tuple = ()) -> list[str]:
    found = []
    for directory, subdirs, names in os.walk(root, followlinks=False):
        rel_dir = Path(directory).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        ignores = _gitignore(Path(directory))
        subdirs[:] = sorted(
            d for d in subdirs
            if d not in SKIPPED_DIRS and not _ignored(d + "/", ignores) and not _excluded(rel_dir + d + "/x", exclude)
        )
        for name in sorted(names):
            if not _ignored(name, ignores) and not (exclude and _excluded(rel_dir + name, exclude)):
                found.append(rel_dir + name)
    return found


def _gitignore(directory: Path) -> list[str]:
    try:
        text = (directory / ".gitignore").read_text(errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _ignored(name: str, patterns: list[str]) -> bool:
    # A subset of gitignore: name globs, directory patterns with a trailing slash, no negation.
    for pattern in patterns:
        if pattern.endswith("/"):
            if name.endswith("/") and fnmatch.fnmatch(name[:-1], pattern[:-1].lstrip("/")):
                return True
        elif fnmatch.fnmatch(name.rstrip("/"), pattern.lstrip("/")):
            return True
    return False


def read_source(root: Path, rel: str, skipped: Counter) -> str | None:
    """The file's text, or None (and a count under the reason) when it must not be indexed."""
    path = root / rel
    try:
        if path.is_symlink() or not path.is_file():
            skipped["not a regular file"] += 1
            return None
        if path.stat().st_size > MAX_FILE_BYTES:
            skipped["oversized"] += 1
            return None
        data = path.read_bytes()
    except OSError:
        skipped["unreadable"] += 1  # deleted while indexing, permissions
        return None
    if b"\0" in data[:SNIFF_BYTES]:
        skipped["binary"] += 1
        return None
    text = data.decode("utf-8", errors="replace")  # undecodable bytes become U+FFFD
    if len(text) > MAX_LINE_CHARS and max(map(len, text.splitlines())) > MAX_LINE_CHARS:
        skipped["minified or vendored"] += 1
        return None
    return text
