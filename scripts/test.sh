#!/usr/bin/env bash
# Sets up (if needed) and runs lint and the whole test suite; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] && .venv/bin/python -c "import specdec, transformers" 2>/dev/null || ./scripts/setup.sh
. .venv/bin/activate
ruff check .
python -m pytest  # addopts has -q; a second -q would hide the "N passed" line
