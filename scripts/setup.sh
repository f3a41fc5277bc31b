#!/usr/bin/env bash
# Creates .venv and installs the project with its test extra (torch pinned to the CPU wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[test]'
