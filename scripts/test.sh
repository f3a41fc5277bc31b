#!/usr/bin/env bash
# Sets up (if needed) and runs lint and the whole test suite; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
# Checked from / so that the installed names answer (a venv from before a rename re-installs).
VENV_PYTHON="$PWD/.venv/bin/python"
[ -x "$VENV_PYTHON" ] && (cd / && "$VENV_PYTHON" -c "import specdec_server, specdec_eval, transformers, xdist") 2>/dev/null \
    || ./scripts/setup.sh
. .venv/bin/activate
ruff check .
# pytest, not `python -m pytest`: -m would put the repository root first on sys.path, where its
# folders shadow installed packages (kernels). addopts has -q; a second -q would hide "N passed".
# One worker a core (the tests run single-threaded); a file's tests stay together, sharing its fixtures.
pytest -n auto --dist loadfile
