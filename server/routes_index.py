"""POST /v1/index and /v1/index/files: keep the prefix cache current as files change."""

import asyncio
import os
import stat
from pathlib import Path

from fastapi import APIRouter

from specdec_server.deps import BodyDep, StateDep
from specdec_server.errors import ApiError

router = APIRouter()


def resolve_inside(path_text: str, roots: list, repo_root: Path | None) -> Path:
    """An absolute path inside one of the configured roots (symlinks resolved), else ApiError."""
    if not isinstance(path_text, str) or not path_text or "\0" in path_text:
        raise ApiError(400, "'path' must be a non-empty string", "path")
    raw = Path(path_text)
    if not raw.is_absolute():
        if repo_root is None:
            raise ApiError(400, "relative 'path' but no repository is served", "path")
        raw = repo_root / raw
    resolved = raw.resolve()
    for root in roots:
        root = Path(root).resolve()
        if resolved == root or root in resolved.parents:
            return resolved
    raise ApiError(403, f"'{path_text}' is outside the indexed roots", "path")


def _index(state):
    if state.engine.index is None:
        raise ApiError(409, "no prefix-cache index is loaded (start the server with --repo)", kind="conflict")
    return state.engine.index


@router.post("/v1/index")
async def index_path(state: StateDep, body: BodyDep):
    """Re-read one file from disk (under the served roots) into the prefix cache, or drop it if gone."""
    idx = _index(state)
    target = resolve_inside(body.get("path"), state.settings.index_roots, idx.root)
    rel = idx.relative(target)
    try:
        info = os.stat(target)
    except FileNotFoundError:
        idx.remove(rel)
        return {"path": rel, "status": "removed"}
    if not stat.S_ISREG(info.st_mode):
        raise ApiError(400, f"'{rel}' is not a regular file", "path")
    if info.st_size > state.settings.max_index_file_bytes:
        raise ApiError(413, f"'{rel}' has {info.st_size} bytes; the limit is {state.settings.max_index_file_bytes}", "path")
    text = target.read_bytes().decode("utf-8", errors="replace")
    await asyncio.to_thread(idx.update, rel, text)  # parsing a big file must not stall the loop
    return {"path": rel, "status": "updated", "chars": len(text)}


@router.post("/v1/index/files")
async def index_files(state: StateDep, body: BodyDep):
    """Apply edits sent by an editor or CI: [{path, text}] updates, [{path, deleted: true}] removals."""
    idx = _index(state)
    files = body.get("files")
    if not isinstance(files, list) or not files:
        raise ApiError(400, "'files' must be a non-empty list of {path, text} or {path, deleted: true}", "files")
    checked = []
    for i, item in enumerate(files):
        if not isinstance(item, dict):
            raise ApiError(400, f"files[{i}] must be an object", "files")
        target = resolve_inside(item.get("path"), state.settings.index_roots or [idx.root], idx.root)
        if item.get("deleted") is True:
            checked.append((idx.relative(target), None))
        elif isinstance(item.get("text"), str):
            if len(item["text"]) > state.settings.max_index_file_bytes:
                raise ApiError(413, f"files[{i}].text is too long", "files")
            checked.append((idx.relative(target), item["text"]))
        else:
            raise ApiError(400, f"files[{i}] needs a string 'text' or 'deleted': true", "files")
    await asyncio.to_thread(_apply, idx, checked)  # validated first: a bad entry changes nothing
    return {"updated": sum(t is not None for _, t in checked), "removed": sum(t is None for _, t in checked)}


def _apply(idx, changes) -> None:
    for rel, text in changes:
        if text is None:
            idx.remove(rel)
        else:
            idx.update(rel, text)
