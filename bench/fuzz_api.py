"""Fuzz the HTTP API at length: tests/server/test_fuzz.py with many examples per operation.

    python bench/fuzz_api.py [--examples 300]

A real uvicorn server of tiny real models on loopback; schemathesis draws valid and invalid
bodies from the OpenAPI schema the app serves. It fails on any 5xx, any call over 30 s, or a
4xx without a JSON message.
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=300, help="per operation and generation mode")
    args = parser.parse_args()
    env = {**os.environ, "SPECDEC_FUZZ_EXAMPLES": str(args.examples)}
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "tests/server/test_fuzz.py"], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
