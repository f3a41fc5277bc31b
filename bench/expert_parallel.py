"""Expert parallelism on this machine: step time and bytes exchanged with 1 and 2 ranks, and the
per-rank expert load of an eval run before and after rebalancing.

    python bench/expert_parallel.py [--ranks 1,2] [--target DIR] [--stats A/results.json --load B/results.json]

Each rank count is a torchrun launch of this file in worker mode. The worker times the target's
forward at 512 cached tokens: a decode step (1 token) and a tree verify (16 tokens), medians of
interleaved repeats, and reads the bytes each rank sent per forward. With 2 ranks on 2 cores no
speedup is expected: every rank computes attention, and the experts of a tiny model are cheap
against the collectives. The load figures place experts from one run's statistics (--stats) and
measure the per-rank token counts of another run (--load), so the balance is out of sample.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# After site-packages: the repository's folders (kernels/, server/, eval/) must not shadow installed packages.
sys.path.append(str(ROOT))


def step_times(model, repeats: int, traffic=None) -> dict:
    """Medians of a decode step and a 16-token verify at 512 cached tokens, interleaved."""
    import torch

    from specdec.models.model import Segment

    ids = torch.randint(100, model.config.vocab_size, (512 + 16,), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache(600)
    model(ids[:512], torch.arange(512), [Segment(cache, 512)])
    cache.keep_all()
    times, sent = {1: [], 16: []}, {1: [], 16: []}
    for _ in range(repeats):
        for n in (1, 16):
            start = time.perf_counter()
            model(ids[512 : 512 + n], torch.arange(512, 512 + n), [Segment(cache, n)])
            times[n].append((time.perf_counter() - start) * 1000)
            sent[n].append(traffic.last_forward_bytes if traffic else 0)
    return {"threads": torch.get_num_threads(), "decode_ms": statistics.median(times[1]),
            "verify16_ms": statistics.median(times[16]), "decode_bytes_rank0": statistics.median(sent[1]),
            "verify16_bytes_rank0": statistics.median(sent[16])}


def worker(target: str, repeats: int) -> None:
    from specdec.parallel import expert_parallel

    channel, model = expert_parallel.start(target)
    if channel.rank != 0:
        sys.exit(expert_parallel.run_follower(model, channel))
    try:
        print(json.dumps({"ranks": channel.world, **step_times(model, repeats, channel.traffic)}), flush=True)
    finally:
        channel.close()


def single_process(target: str, repeats: int) -> dict:
    import torch

    from specdec import load_model

    torch.set_num_threads(1)
    return {"ranks": "none (one process, no expert parallelism)", **step_times(load_model(target), repeats)}


def _launch(ranks: int, target: str, repeats: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1", "--master-port", str(port),
               __file__, "--worker", "--target", target, "--repeats", str(repeats)]
    run = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if run.returncode:
        raise SystemExit(f"torchrun with {ranks} rank(s) failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def load_balance(stats_path: Path, load_path: Path, ranks: int) -> dict:
    from specdec.parallel.distributed import placement, rank_loads, read_statistics

    stats, load = read_statistics(stats_path), read_statistics(load_path)
    out = {"stats": str(stats_path), "load": str(load_path), "ranks": ranks, "layers": []}
    for layer, (seen, counts) in enumerate(zip(stats, load, strict=True)):
        before = rank_loads(counts, placement(len(counts), ranks))
        after = rank_loads(counts, placement(len(counts), ranks, seen))
        mean = sum(counts) / ranks
        out["layers"].append({"layer": layer, "contiguous": before, "rebalanced": after,
                              "max_over_mean_before": round(max(before) / mean, 3),
                              "max_over_mean_after": round(max(after) / mean, 3)})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="1,2")
    parser.add_argument("--target", default=str(ROOT / "specdec" / "default_models" / "target"))
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--stats", type=Path, help="results.json whose expert load places the experts")
    parser.add_argument("--load", type=Path, help="results.json whose expert load is measured")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "expert_parallel.json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.target, args.repeats)
        return 0
    report = {"steps": [single_process(args.target, args.repeats)]
              + [_launch(int(n), args.target, args.repeats) for n in args.ranks.split(",")]}
    if args.stats and args.load:
        report["expert_load"] = load_balance(args.stats, args.load, 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
