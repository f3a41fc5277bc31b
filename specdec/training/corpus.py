"""The training corpus: this interpreter's standard library sources, split by file into train and validation."""

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
VALIDATION_PERCENT = 5


@dataclass
class SourceFile:
    path: str  # relative to the stdlib root, POSIX style
    text: str

    @property
    def package(self) -> str:
        return os.path.dirname(self.path)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_validation(path: str) -> bool:
    """About VALIDATION_PERCENT% of files, chosen by a hash of the path so the split is stable."""
    digest = hashlib.sha1(path.encode()).digest()
    return digest[0] * 100 // 256 < VALIDATION_PERCENT


def load_corpus(root: Path | None = None) -> tuple[list[SourceFile], list[SourceFile]]:
    """(train, validation) lists of the .py files under root, sorted by path."""
    root = root or stdlib_root()
    train, validation = [], []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in EXCLUDED_DIRS)
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            full = Path(directory) / name
            rel = full.relative_to(root).as_posix()
            text = full.read_bytes().decode("utf-8", errors="replace")
            (validation if is_validation(rel) else train).append(SourceFile(rel, text))
    return train, validation
