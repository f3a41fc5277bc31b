"""A benchmark's model: the file named on its command line, else the pulled default, else a clear exit."""

import subprocess
import sys
from pathlib import Path

import pytest

from bench.pulled import target_or_default

ROOT = Path(__file__).resolve().parents[2]


def test_a_given_file_is_taken_as_it_is(tmp_path):
    given = tmp_path / "model.gguf"
    assert target_or_default(given) == given


def test_without_a_file_or_a_pulled_default_it_exits_naming_the_flag(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "empty-cache"))
    with pytest.raises(SystemExit, match="no --gguf, and the default model is not pulled"):
        target_or_default(None, "--gguf")


def test_a_benchmark_run_as_a_file_exits_with_the_message_not_a_traceback(tmp_path):
    """bench/midword.py is run as a file, not a module: it must still find bench.pulled."""
    env = {"SPECDEC_HOME": str(tmp_path / "empty-cache"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "midword.py"), "--repo", str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode != 0
    assert "the default model is not pulled" in done.stderr
    assert "Traceback" not in done.stderr
