"""Drafts adapted to one repository (`specdec adapt`): where they live and whether they fit a target.

An adapted draft is an ordinary draft directory plus a card, `adapt.json`, that names the target
it was distilled against by a fingerprint of that target's config and weights. A draft adapted
against another target would still be lossless (the target verifies every token) but it would
agree with nothing, so it is refused when given explicitly and skipped, with a log line, when
found beside a repository.

Where a repository's adapted draft is kept: `INDEX_DIR/draft` for a saved index, and
`REPO/.specdec/draft` for a repository indexed at start-up (`specdec serve --repo REPO`).
"""

import hashlib
import json
import logging
from pathlib import Path

log = logging.getLogger("specdec.models.adapted")

CARD = "adapt.json"
REPO_DIR = ".specdec"
_fingerprints: dict[tuple, str] = {}


class AdaptedDraftMismatch(ValueError):
    """A draft adapted against a different target than the one being served."""


def target_fingerprint(model_dir) -> str:
    """sha256 over the target's config.json and its weight files, or over a GGUF file (cached per
    file size and mtime)."""
    model_dir = Path(model_dir)
    config = None if model_dir.is_file() else model_dir / "config.json"  # a GGUF file holds its config
    weights = [model_dir] if config is None else sorted(model_dir.glob("*.safetensors"))
    files = ([config] if config else []) + weights
    key = tuple((str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    if key not in _fingerprints:
        digest = hashlib.sha256()
        if config is not None:
            digest.update(json.dumps(json.loads(config.read_text()), sort_keys=True).encode())
        for f in weights:
            with f.open("rb") as stream:
                for block in iter(lambda: stream.read(1 << 20), b""):
                    digest.update(block)
        _fingerprints[key] = digest.hexdigest()
    return _fingerprints[key]


def read_card(draft_dir) -> dict | None:
    path = Path(draft_dir) / CARD
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise AdaptedDraftMismatch(f"{path}: unreadable adaptation card ({err})") from err


def check_fits(draft_dir, target_dir) -> None:
    """Raise AdaptedDraftMismatch when `draft_dir` was adapted against another target."""
    card = read_card(draft_dir)
    if card is None:
        return
    expected, actual = card.get("target_fingerprint"), target_fingerprint(target_dir)
    if expected != actual:
        raise AdaptedDraftMismatch(
            f"{draft_dir}: this draft was adapted against another target (fingerprint {str(expected)[:12]}, "
            f"the target in {target_dir} is {actual[:12]}); rerun `specdec adapt` with this target, "
            "or pass the shipped draft")


def repository_draft_dir(repo=None, index_dir=None) -> Path | None:
    """Where the adapted draft of a saved index or a repository is kept (it may not exist)."""
    if index_dir is not None:
        return Path(index_dir) / "draft"
    if repo is not None:
        return Path(repo) / REPO_DIR / "draft"
    return None


def adapted_draft_for(target_dir, repo=None, index_dir=None) -> Path | None:
    """The repository's adapted draft when there is one and it fits the target, else None (logged)."""
    where = repository_draft_dir(repo, index_dir)
    if where is None or not (where / CARD).is_file():
        return None
    try:
        check_fits(where, target_dir)
    except AdaptedDraftMismatch as err:
        log.warning("not using the repository's adapted draft, falling back to the shipped one: %s", err)
        return None
    log.info("using the repository's adapted draft in %s", where)
    return where
