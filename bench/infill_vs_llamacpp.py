"""/infill through our server against llama.cpp's llama-server, same bodies, one client, warm.

    python bench/infill_vs_llamacpp.py --repo REPO --llamacpp LLAMA_CPP_DIR [--gguf FILE] [--points 30]
                                       [--quantize auto|none|int8|blocks] [--threads 2] [--out FILE]

Both servers serve the same GGUF file: --gguf, by default the pulled default model (ours packs it
in 8-bit blocks, as it serves by default), or, with --embedded, the shipped target (llama-server
from the GGUF f32 that bench_decode.py converts). Each body (a cursor at a line start of one of REPO's Python files: the text before it
and after it) is sent twice to each server, alternating between them. The second answer is the
warm one, with its prompt cached, and it is the one counted. Reported per server: the median of
predicted_ms / predicted_n (ms per generated token, as each server's own timings give it) and of
the request's wall time, and the tokens generated: each server's own stop rules end its answer
(ours stops single-line answers at the line's end), so wall times compare only at equal length.
Ours speculates, as it does for a user; llama-server decodes plainly.
"""

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

# After site-packages: the repository's folders (kernels/, server/, eval/) must not shadow installed packages.
sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench.bench_decode import LlamaBench  # noqa: E402
from bench.pulled import target_or_default  # noqa: E402
from specdec import default_model_dir  # noqa: E402

PREFIX_CHARS, SUFFIX_CHARS = 3000, 1000


def bodies(repo: Path, count: int, seed: int = 0) -> list[dict]:
    files = sorted(p for p in repo.rglob("*.py") if p.stat().st_size > 2000)
    rng, out = random.Random(seed), []
    while len(out) < count and files:
        text = rng.choice(files).read_text(encoding="utf-8", errors="replace")
        starts = [i + 1 for i, c in enumerate(text) if c == "\n" and 500 < i < len(text) - 200]
        if not starts:
            continue
        cut = rng.choice(starts)
        out.append({"input_prefix": text[max(0, cut - PREFIX_CHARS) : cut], "input_suffix": text[cut : cut + SUFFIX_CHARS],
                    "n_predict": 32, "temperature": 0, "cache_prompt": True, "t_max_predict_ms": 5000})
    return out


def wait_ready(url: str, proc, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url}: not ready in {seconds} s")


def timed(client: httpx.Client, url: str, body: dict) -> tuple[float, float, int]:
    """(ms per generated token by the server's own timings, wall ms, tokens generated)."""
    started = time.perf_counter()
    answer = client.post(f"{url}/infill", json=body, timeout=60).json()
    wall = (time.perf_counter() - started) * 1000
    timings = answer["timings"]
    return timings["predicted_ms"] / max(1, timings["predicted_n"]), wall, timings["predicted_n"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, required=True)
    p.add_argument("--llamacpp", type=Path, required=True)
    p.add_argument("--points", type=int, default=30)
    p.add_argument("--gguf", type=Path, help="default: the pulled default model")
    p.add_argument("--embedded", action="store_true", help="the shipped embedded target instead of a GGUF file")
    p.add_argument("--quantize", default="auto")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    requests = bodies(args.repo, args.points)
    with tempfile.TemporaryDirectory() as tmp:
        if args.embedded:
            gguf = LlamaBench(args.llamacpp, default_model_dir(), args.threads, Path(tmp)).gguf
            ours = default_model_dir() / "target"
        else:
            gguf = ours = target_or_default(args.gguf, "--gguf")
        servers = {
            "ours": ([str(Path(sys.executable).parent / "specdec"), "serve", "--port", "8191", "--fim-mode", "psm", "--quantize", args.quantize,
                      "--target", str(ours)], "http://127.0.0.1:8191"),
            "llama.cpp": ([str(args.llamacpp.resolve() / "build" / "bin" / "llama-server"), "-m", str(gguf), "-t",
                           str(args.threads), "-c", "4096", "--port", "8192"], "http://127.0.0.1:8192"),
        }
        procs = {name: subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for name, (cmd, _) in servers.items()}
        try:
            for name, proc in procs.items():
                wait_ready(servers[name][1], proc)
            samples = {name: [] for name in servers}
            with httpx.Client() as client:
                for body in requests:
                    for name, (_, url) in servers.items():
                        timed(client, url, body)  # warms the prompt cache
                        samples[name].append(timed(client, url, body))
        finally:
            for proc in procs.values():
                proc.terminate()
                proc.wait(timeout=30)
    report = {"command": " ".join(sys.argv), "gguf": str(gguf), "points": len(requests), "quantize": args.quantize,
              "threads": args.threads,
              **{name: {"ms_per_token_median": round(statistics.median(s[0] for s in rows), 3),
                        "wall_ms_median": round(statistics.median(s[1] for s in rows), 1),
                        "tokens_median": statistics.median(s[2] for s in rows)}
                 for name, rows in samples.items()}}
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
