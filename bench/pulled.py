"""The model a benchmark measures: the file given on its command line, else the pulled default."""

from pathlib import Path

from specdec.models.model_cache import default_target


def target_or_default(given: Path | None, flag: str = "--target") -> Path:
    """`given`, else the pulled default model's file; exits with a message when neither is there."""
    path = given or default_target()[1]
    if path is None:
        raise SystemExit(f"no {flag}, and the default model is not pulled (specdec models pull)")
    return Path(path)
