"""Another build of the native library, for the benchmarks that time two builds in turns."""

import ctypes
from pathlib import Path


def other_build(path: Path, lib: ctypes.CDLL, *names: str) -> ctypes.CDLL:
    """The build at `path`, its functions `names` given this build's signatures; exits with a
    message when it cannot be loaded."""
    try:
        other = ctypes.CDLL(str(path))
    except OSError as error:
        raise SystemExit(f"--against {path}: {error}") from None
    for name in names:
        mine, theirs = getattr(lib, name), getattr(other, name)
        theirs.restype, theirs.argtypes = mine.restype, mine.argtypes
    return other
