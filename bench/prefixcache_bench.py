"""Prefix-cache benchmark: index CPython's Lib/, time load/propose/update, and hit rates per language.

    python bench/prefixcache_bench.py [--points 1000] [--json out.json]

Hit rate: for random cursor positions in held-out files (indexed without those files; each one's
text before the cursor is added through update(), so nothing after the cursor is in the index),
the fraction of points where some candidate, and where the top candidate, starts with the true
next 4 characters. Points whose next 4 characters cross a line end are left out.
"""

import argparse
import json
import random
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from prefixcache import Index

BUILDS = 5  # of the stdlib index, each including its save
STDLIB_EXCLUDE = ["test", "tests", "idle_test", "site-packages", "__pycache__"]
SITE = Path(sysconfig.get_paths()["purelib"])
CORPORA = {  # language -> (repository, file suffixes)
    "python": (SITE / "transformers" / "models", (".py",)),
    "javascript": (Path("/usr/lib/node_modules/npm"), (".js",)),
    "c": (Path("/usr/include"), (".h",)),
}


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def bench_stdlib(points: int, rng: random.Random) -> dict:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = Path(tempfile.mkdtemp()) / "idx"
    builds = []
    for _ in range(BUILDS):  # this machine's speed drifts by 20% within a minute: take the median
        started = time.perf_counter()
        idx = Index.build(root, exclude=STDLIB_EXCLUDE)
        idx.save(out)
        builds.append(time.perf_counter() - started)
    disk = sum(p.stat().st_size for p in out.iterdir())
    loads = []
    for _ in range(5):
        t = time.perf_counter()
        idx = Index.load(out)
        loads.append(time.perf_counter() - t)
    files = [f["path"] for f in idx.files if f["path"].endswith(".py")]
    texts = {p: (root / p).read_text(errors="replace") for p in rng.sample(files, 200)}
    latencies = []
    for _ in range(points):
        path = rng.choice(list(texts))
        text = texts[path]
        cursor = rng.randrange(len(text))
        t = time.perf_counter()
        idx.propose(text[:cursor], path=path)
        latencies.append((time.perf_counter() - t) * 1000)
    big = next(p for p in files if (root / p).read_text(errors="replace").count("\n") >= 1000)
    big_text = (root / big).read_text(errors="replace")
    lines = big_text.splitlines(keepends=True)[:1000]
    updates = []
    for i in range(30):
        t = time.perf_counter()
        idx.update(big, "".join(lines[: 1000 - (i % 2)]))
        updates.append((time.perf_counter() - t) * 1000)
    shutil.rmtree(out.parent, ignore_errors=True)
    return {"files": idx.summary.get("indexed"), "source_mb": idx.summary.get("source_chars", 0) / 1e6,
            "build_s": round(statistics.median(builds), 2), "build_s_runs": [round(b, 2) for b in builds], "disk_mb": round(disk / 1e6, 2),
            "disk_ratio": round(disk / idx.summary.get("source_chars", 1), 3),
            "load_s_median": round(statistics.median(loads), 4),
            "propose_ms_p50": round(percentile(latencies, 0.5), 3), "propose_ms_p99": round(percentile(latencies, 0.99), 3),
            "update_1000_lines_ms_p50": round(statistics.median(updates), 2)}


def hit_rate(language: str, root: Path, suffixes, points: int, rng: random.Random) -> dict | None:
    if not root.is_dir():
        return None
    candidates = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.suffix in suffixes and p.is_file())
    held_out = rng.sample(candidates, min(100, len(candidates) // 5))
    idx = Index.build(root, exclude=held_out)
    any_hit = top_hit = counted = 0
    while counted < points:
        path = rng.choice(held_out)
        text = (root / path).read_text(errors="replace")
        if len(text) < 10:
            continue
        cursor = rng.randrange(len(text) - 4)
        truth = text[cursor : cursor + 4]
        if "\n" in truth:
            continue
        idx.update(path, text[:cursor])
        found = [c.text for c in idx.propose(text[:cursor], path=path)]
        idx.remove(path)
        counted += 1
        any_hit += any(c.startswith(truth) for c in found)
        top_hit += bool(found) and found[0].startswith(truth)
    return {"repo": str(root), "held_out_files": len(held_out), "points": counted,
            "any_candidate": round(any_hit / counted, 3), "top_candidate": round(top_hit / counted, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--points", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    report = {"stdlib": bench_stdlib(args.points, rng), "hit_rate": {}}
    print(json.dumps(report["stdlib"], indent=2), flush=True)
    for language, (root, suffixes) in CORPORA.items():
        result = hit_rate(language, root, suffixes, args.points, rng)
        if result:
            report["hit_rate"][language] = result
            print(language, json.dumps(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
