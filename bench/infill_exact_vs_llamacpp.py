"""Rest-of-line exact match of /infill: our server against llama.cpp's llama-server, same GGUF file.

    python bench/infill_exact_vs_llamacpp.py --repo REPO --llamacpp LLAMA_CPP_DIR [--gguf FILE]
                                             [--points 30] [--seed 0] [--threads 2] [--out FILE]

Bodies as llama.vim sends them while a line is being typed: 120 lines before the cursor's line
(input_prefix), the cursor's line up to the cursor (prompt), and the 40 lines after it
(input_suffix; nothing follows the cursor on its line, as when typing at its end). The cursor is
4 characters past a line's indentation; then one more character is typed, and that second
request is the one scored (its prompt is the first one's plus a character, as while typing). Both servers decode greedily (llama-server: top_k 1). A point is an exact match when the
answer's first line equals the rest of the file's line after the cursor (trailing blanks
ignored). GGUF defaults to the pulled default model. Each server runs alone in turn.
"""

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx

# After site-packages: the repository's folders (kernels/, server/, eval/) must not shadow installed packages.
sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench.infill_vs_llamacpp import wait_ready  # noqa: E402
from bench.pulled import target_or_default  # noqa: E402

BEFORE, AFTER, INTO_LINE = 120, 40, 4


def points(repo: Path, count: int, seed: int) -> list[dict]:
    """(first body, second body, the rest of the line after the second body's cursor)."""
    rng, out = random.Random(seed), []
    files = sorted(p for p in repo.rglob("*.py") if p.stat().st_size > 2000)
    while len(out) < count:
        lines = rng.choice(files).read_text(encoding="utf-8", errors="replace").split("\n")
        row = rng.randrange(len(lines))
        line = lines[row]
        indent = len(line) - len(line.lstrip())
        cursor = indent + INTO_LINE
        if len(line.rstrip()) < cursor + 3:  # the rest of the line must be more than the typed character
            continue
        bodies = [_body(lines, row, cursor + typed) for typed in (0, 1)]
        out.append({"bodies": bodies, "rest": line[cursor + 1 :].rstrip()})
    return out


def _body(lines: list, row: int, cursor: int) -> dict:
    line = lines[row]
    return {"input_prefix": "".join(f"{text}\n" for text in lines[max(0, row - BEFORE) : row]),
            "prompt": line[:cursor], "input_suffix": "\n" + "\n".join(lines[row + 1 : row + 1 + AFTER]),
            "input_extra": [], "n_predict": 64, "temperature": 0, "top_k": 1, "samplers": ["top_k"],
            "cache_prompt": True, "stream": False, "t_max_predict_ms": 5000}


def score(url: str, cases: list) -> dict:
    hits, answers, walls = 0, [], []
    with httpx.Client() as client:
        for case in cases:
            first, second = case["bodies"]
            client.post(f"{url}/infill", json=first, timeout=120)
            started = time.perf_counter()
            content = client.post(f"{url}/infill", json=second, timeout=120).json()["content"]
            walls.append((time.perf_counter() - started) * 1000)
            line = content.split("\n", 1)[0].rstrip()
            hits += line == case["rest"]
            answers.append(line)
    walls.sort()
    return {"exact": hits, "points": len(cases), "wall_ms_median": round(walls[len(walls) // 2], 1),
            "answers": answers}


def serve(command: list, url: str, cases: list) -> dict:
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, proc, seconds=300)
        return score(url, cases)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, required=True)
    p.add_argument("--llamacpp", type=Path, required=True)
    p.add_argument("--gguf", type=Path)
    p.add_argument("--points", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    gguf = target_or_default(args.gguf, "--gguf")
    cases = points(args.repo, args.points, args.seed)
    server = args.llamacpp.resolve() / "build" / "bin" / "llama-server"
    results = {
        "ours": serve([str(Path(sys.executable).parent / "specdec"), "serve", "--target", str(gguf), "--port", "8193",
                       "--fim-mode", "psm"],
                      "http://127.0.0.1:8193", cases),
        "llama.cpp": serve([str(server), "-m", str(gguf), "-t", str(args.threads), "-c", "8192", "--port", "8194"],
                           "http://127.0.0.1:8194", cases),
    }
    report = {"repo": str(args.repo), "gguf": str(gguf), "seed": args.seed, "expected": [c["rest"] for c in cases],
              **results}
    print(json.dumps({name: {k: v for k, v in r.items() if k != "answers"} for name, r in results.items()}, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
