"""The training corpus: the standard library plus pinned open-source Python packages, deduplicated,
split into train and held-out by package.

Packages are fetched with `pip download NAME==VERSION --no-deps` (wheels or sdists) into a cache
under runs/, and only their .py sources are read. Vendored copies of other projects are skipped,
and so is every repository that the project evaluates on (EVAL_REPOSITORIES), wherever it appears.
"""

import hashlib
import logging
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from specdec.training.dedup import drop_duplicates

log = logging.getLogger("specdec.training")

# faker is left out: its sources are mostly locale word lists, not code.
# Pinned so that the corpus, and so the trained weights, can be rebuilt exactly.
PACKAGES = {
    "aiohttp": "3.14.5", "alembic": "1.20.1", "ansible-core": "2.19.14", "arrow": "1.4.0",
    "astroid": "4.3.4", "attrs": "26.1.0", "babel": "2.19.0", "bleach": "6.4.0", "bokeh": "3.9.2",
    "boto3": "1.44.8", "botocore": "1.44.8", "bottle": "0.13.4", "cattrs": "26.2.1", "celery": "5.7.0",
    "cmd2": "4.3.1", "dask": "2026.8.0", "django": "5.2.19", "docutils": "0.23",
    "falcon": "4.4.0", "fastapi": "0.165.0", "gunicorn": "27.0.1", "httpcore": "1.0.9", "httpx": "0.28.1",
    "hypothesis": "6.170.17", "invoke": "3.0.3", "ipython": "9.18.1", "isort": "9.0.2", "jedi": "0.20.1",
    "jinja2": "3.1.6", "kombu": "5.7.0", "lxml": "6.1.3", "mako": "1.4.3", "markdown": "3.11.3",
    "marshmallow": "4.4.0", "matplotlib": "3.11.2", "mistune": "3.4.0", "more-itertools": "11.2.1",
    "mypy": "2.4.1", "nbformat": "5.11.1", "networkx": "3.6.1", "numpy": "2.4.6", "openpyxl": "3.1.5",
    "packaging": "26.4", "pandas": "3.1.1", "paramiko": "5.1.0", "parso": "0.8.7", "peewee": "4.5.3",
    "pendulum": "3.3.0", "pillow": "13.0.0", "pip": "26.3", "pluggy": "1.7.0", "prompt-toolkit": "3.0.53",
    "pycodestyle": "2.15.0", "pydantic": "2.14.4", "pyflakes": "4.1.0", "pygments": "2.21.0",
    "pylint": "4.1.4", "pymongo": "4.20.1", "pyramid": "2.1", "pytest": "9.2.0", "pyyaml": "6.0.4",
    "redis": "8.1.0", "rich": "15.0.0", "ruamel.yaml": "0.19.1", "sanic": "25.12.1", "scipy": "1.17.1",
    "scrapy": "2.19.0", "setuptools": "84.2.1", "sphinx": "9.0.4", "sqlalchemy": "2.1.9",
    "sqlparse": "0.6.1", "sympy": "1.14.0", "tenacity": "9.2.1", "textual": "8.2.8", "toolz": "1.2.0",
    "tornado": "6.6.1", "tqdm": "4.70.1", "traitlets": "5.16.1", "transformers": "5.24.0",
    "twisted": "26.10.0", "typer": "0.29.2", "urllib3": "2.8.0", "urwid": "5.1.0", "uvicorn": "0.54.0",
    "websockets": "17.4", "werkzeug": "3.1.9", "xarray": "2026.9.0", "xlrd": "2.0.2",
}
# Held out whole, never trained on: the figures on them are honest for unseen projects.
HELD_OUT = ("arrow", "attrs", "bottle", "marshmallow", "peewee", "rich", "sqlparse", "tenacity")
# The evaluation repositories: kept out of training wherever a copy of them appears.
EVAL_REPOSITORIES = ("starlette", "black", "httpie", "express", "flask", "requests", "click")
SKIPPED_DIRS = {"__pycache__", "_vendor", "vendor", "vendored", "_vendored", "extern", "_distutils",
                "site-packages", "idle_test", "test", "tests"} | set(EVAL_REPOSITORIES)
STDLIB_SKIPPED = {"lib2to3", "ensurepip", "pydoc_data"}
MAX_FILE_BYTES = 200_000
MAX_PACKAGE_BYTES = 6_000_000  # keeps the largest packages (sympy, django, botocore) from dominating


@dataclass
class SourceFile:
    path: str  # "<package>/<path inside it>", POSIX style
    text: str

    @property
    def package(self) -> str:
        """The top-level package: the unit of the train/held-out split and of repository context."""
        return self.path.split("/", 1)[0]

    @property
    def directory(self) -> str:
        return os.path.dirname(self.path)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def download(cache: Path, packages: dict = PACKAGES) -> dict[str, Path]:
    """{name: archive} for every pinned package, fetched once into cache (pip's own index settings)."""
    cache.mkdir(parents=True, exist_ok=True)
    archives = {}
    for name, version in sorted(packages.items()):
        found = _cached_archive(cache, name, version)
        if found is None:
            log.info("pip download %s==%s", name, version)
            command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(cache), f"{name}=={version}"]
            done = subprocess.run(command, capture_output=True, text=True)
            found = _cached_archive(cache, name, version)
            if found is None:
                raise RuntimeError(f"pip download {name}=={version} failed: {done.stderr.strip()[-500:]}")
        archives[name] = found
    return archives


def _cached_archive(cache: Path, name: str, version: str) -> Path | None:
    stem = re.sub(r"[-_.]+", "_", name).lower()
    for path in sorted(cache.iterdir()):
        normalized = re.sub(r"[-_.]+", "_", path.name).lower()
        if normalized.startswith(f"{stem}_{version.replace('.', '_')}_"):
            return path
    return None


def read_archive(archive: Path) -> list[tuple[str, bytes]]:
    """(inner path, bytes) of the .py files of a wheel or an sdist."""
    if archive.suffix == ".whl" or archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            return [(n, z.read(n)) for n in sorted(z.namelist()) if n.endswith(".py")]
    with tarfile.open(archive) as t:
        members = sorted((m for m in t.getmembers() if m.isfile() and m.name.endswith(".py")), key=lambda m: m.name)
        # an sdist has one top directory, name-version/, which is dropped
        return [(m.name.split("/", 1)[-1], t.extractfile(m).read()) for m in members]


def is_code_file(inner_path: str, data: bytes) -> bool:
    parts = inner_path.split("/")
    if any(p in SKIPPED_DIRS or p.endswith((".dist-info", ".egg-info")) for p in parts[:-1]):
        return False
    if len(data) > MAX_FILE_BYTES or len(data) < 64:
        return False
    lines = data.split(b"\n")
    long_lines = sum(len(line) > 200 for line in lines)
    return long_lines <= 0.05 * len(lines)  # generated tables and data dumps, not code


def _package_files(name: str, entries, limit: int = MAX_PACKAGE_BYTES) -> list[SourceFile]:
    """The package's code files, capped at limit bytes (files taken in a stable hashed order)."""
    chosen = [(p, d) for p, d in entries if is_code_file(p, d)]
    chosen.sort(key=lambda e: hashlib.sha1(e[0].encode()).digest())
    files, total = [], 0
    for inner, data in chosen:
        if total + len(data) > limit:
            continue
        total += len(data)
        files.append(SourceFile(f"{name}/{inner}", data.decode("utf-8", errors="replace")))
    return sorted(files, key=lambda f: f.path)


def stdlib_entries(root: Path | None = None):
    root = root or stdlib_root()
    for directory, subdirs, names in os.walk(root):
        rel_dir = Path(directory).relative_to(root).as_posix()
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS and not (rel_dir == "." and d in STDLIB_SKIPPED))
        for name in sorted(n for n in names if n.endswith(".py")):
            full = Path(directory) / name
            yield full.relative_to(root).as_posix(), full.read_bytes()


def load_corpus(cache: Path, packages: dict = PACKAGES, held_out=HELD_OUT, include_stdlib: bool = True):
    """(train, held_out) lists of SourceFile: the pinned packages (downloaded once) and the stdlib."""
    sources = {name: read_archive(archive) for name, archive in download(cache, packages).items()}
    if include_stdlib:
        sources["stdlib"] = list(stdlib_entries())
    return build_corpus(sources, held_out)


def build_corpus(sources: dict, held_out=HELD_OUT):
    """{package: [(inner path, bytes)]} -> (train, held_out), deduplicated across every package.

    Held-out files go first into deduplication, so that a file present in both keeps its
    held-out copy and its twin leaves training."""
    files = []
    for name in sorted(sources):
        files += _package_files(_normalized(name), sources[name])
    held = {_normalized(h) for h in held_out}
    files.sort(key=lambda f: (f.package not in held, f.path))
    kept = drop_duplicates(files)
    log.info("corpus: %d files read, %d after deduplication", len(files), len(kept))
    train = sorted((f for f in kept if f.package not in held), key=lambda f: f.path)
    test = sorted((f for f in kept if f.package in held), key=lambda f: f.path)
    return train, test


def _normalized(name: str) -> str:
    return re.sub(r"[-.]+", "_", name).lower()


def corpus_summary(files) -> dict:
    per_package = {}
    for f in files:
        per_package[f.package] = per_package.get(f.package, 0) + len(f.text)
    return {"files": len(files), "chars": sum(per_package.values()), "packages": len(per_package)}

