"""What pricing a token tree by the experts it wakes could gain over pricing it by its size,
measured on the verify passes a target serves.

    python bench/expert_routing.py --repo DIR [--target DIR] [--points 60] [--max-tokens 48]
                                   [--out bench/results/expert_routing.json]

The engine completes each point with every strategy, its trees forced (--always-speculate) and
cut to a budget drawn per request from SIZES, so verify passes of many sizes are served on real
code. Every lone forward is logged (its tokens, cached tokens, each MoE layer's expert ids and
milliseconds), and three questions are answered:

- routing: do neighbouring tokens pick the same experts (the overlap of consecutive plain
  steps' top-k against what independent picks from the layer's expert frequencies give)? A
  router-based forecast of a tree's experts has nothing to work with where they do not;
- woken by size: the distinct experts passes of each size wake, against independent picks;
- cost: least squares of the pass's milliseconds on its size (a level per size, as the
  engine's cost curve has) and cached tokens, and on those and its distinct experts woken. The
  second knows each pass's woken count exactly, which no forecast can, so the gap between the
  two errors is the most that expert-aware pricing could gain over the size curve.
"""

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

SIZES = (2, 3, 4, 6, 8, 12, 16, 24, 32)  # tree budgets, one drawn per request
STRATEGIES = ("hybrid", "trie", "draft", "ar")


def serve_and_log(engine, index, points, max_tokens: int, seed: int) -> list[dict]:
    """[{n, cached, ms, ids [layers][n][k], request}] of every forward with one sequence and
    no prompt chunk (a plain step or a verify pass alone), served on `points`."""
    from specdec_eval.runner import prepare_point

    target, run, logged = engine.target, engine.target.run, []  # the scheduler's forwards go through run()
    current = {"request": None}

    def logging_run(ids, positions, segments, logits_rows=None):
        started = time.perf_counter()
        out = run(ids, positions, segments, logits_rows=logits_rows)
        millis = (time.perf_counter() - started) * 1000
        if current["request"] and logits_rows is None and len(segments) == 1 and ids.numel() <= max(SIZES):
            routes = [ids.tolist() for ids in target.latest_routes()]
            logged.append({"n": ids.numel(), "cached": int(positions[0]), "ms": millis, "ids": routes,
                           "request": current["request"]})
        return out

    target.run = logging_run
    rng = random.Random(seed)
    try:
        for i, point in enumerate(points):
            prepare_point(index, point)
            engine.complete(point.prefix, point.suffix, mode=point.mode, max_tokens=0, path=point.path)
            for strategy in STRATEGIES:
                engine.max_tree_nodes = rng.choice(SIZES)
                engine.forget_history(None)
                current["request"] = f"{i}:{strategy}"
                engine.complete(point.prefix, point.suffix, strategy=strategy, mode=point.mode,
                                max_tokens=max_tokens, path=point.path)
                current["request"] = None
            print(f"\r{i + 1}/{len(points)} points, {len(logged)} forwards", end="", file=sys.stderr, flush=True)
    finally:
        target.run = run
    print(file=sys.stderr)
    return logged


def woken(forward: dict) -> int:
    return sum(len({e for token in layer for e in token}) for layer in forward["ids"])


def expert_frequencies(forwards, num_experts: int) -> np.ndarray:
    """[layers, E]: the share of tokens that pick each expert (a row sums to top_k)."""
    counts, tokens = None, 0
    for f in forwards:
        ids = np.asarray(f["ids"])  # [layers, n, k]
        if counts is None:
            counts = np.zeros((ids.shape[0], num_experts))
        for layer in range(ids.shape[0]):
            counts[layer] += np.bincount(ids[layer].reshape(-1), minlength=num_experts)
        tokens += ids.shape[1]
    return counts / max(1, tokens)


def neighbour_overlap(forwards, frequencies: np.ndarray) -> dict:
    """The share of a token's top-k experts that the token before it also picked, per layer,
    from consecutive plain steps of one request, against independent picks (sum f_e^2 / k)."""
    top_k = round(frequencies[0].sum())
    shared, previous = [], None
    for f in forwards:
        if f["n"] != 1:
            continue
        if previous is not None and previous["request"] == f["request"] and f["cached"] == previous["cached"] + 1:
            shared.append([len(set(a[0]) & set(b[0])) / top_k for a, b in zip(previous["ids"], f["ids"], strict=True)])
        previous = f
    independent = (frequencies ** 2).sum(axis=1) / top_k
    measured = np.asarray(shared).mean(axis=0) if shared else np.full(len(independent), float("nan"))
    return {"pairs": len(shared), "measured": measured.round(4).tolist(), "independent": independent.round(4).tolist()}


def woken_by_size(forwards, frequencies: np.ndarray) -> dict:
    """{n: {passes, mean, sd, independent}}: distinct experts woken over all layers."""
    by_size: dict = {}
    for f in forwards:
        by_size.setdefault(f["n"], []).append(woken(f))
    picked = np.minimum(1.0, frequencies)  # P(a token picks expert e), per layer
    out = {}
    for n, counts in sorted(by_size.items()):
        if len(counts) >= 10:
            independent = float((1.0 - (1.0 - picked) ** n).sum())
            out[n] = {"passes": len(counts), "mean": round(statistics.mean(counts), 2),
                      "sd": round(statistics.pstdev(counts), 2), "independent": round(independent, 2)}
    return out


def cost_fits(forwards) -> dict:
    """Least squares of milliseconds on the pass's size (a level per size, as the engine's cost
    curve has, plus cached tokens) alone and with its woken experts: the second's coefficient is
    what one expert more costs among passes of the same size. Passes slower than twice their
    size's median (a stall of the machine) are left out."""
    times: dict = {}
    for f in forwards:
        times.setdefault(f["n"], []).append(f["ms"])
    medians = {n: statistics.median(v) for n, v in times.items()}
    kept = [f for f in forwards if f["ms"] <= 2 * medians[f["n"]]]
    sizes = sorted({f["n"] for f in kept})
    y = np.array([f["ms"] for f in kept])
    size = np.array([[float(f["n"] == n) for n in sizes] + [f["cached"] / 1000] for f in kept])
    experts = np.column_stack([size, [woken(f) for f in kept]])
    fits = {"passes": len(kept), "left_out": len(forwards) - len(kept)}
    for name, x in (("size", size), ("size_and_woken", experts)):
        beta, *_ = np.linalg.lstsq(x, y, rcond=None)
        fits[name] = {"mae_ms": round(float(np.abs(y - x @ beta).mean()), 4),
                      "ms_per_1000_cached": round(float(beta[len(sizes)]), 4)}
        if name == "size_and_woken":
            fits["ms_per_woken_expert"] = round(float(beta[-1]), 4)
    fits["mae_cut_by_knowing_woken"] = round(1 - fits["size_and_woken"]["mae_ms"] / fits["size"]["mae_ms"], 3)
    return fits


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--target", type=Path, default=None, help="a target directory (default: the embedded one)")
    parser.add_argument("--points", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/expert_routing.json"))
    args = parser.parse_args(argv)
    if not args.repo.is_dir():
        parser.error(f"--repo {args.repo}: not a directory")
    from prefixcache import Index
    from specdec import Engine
    from specdec_eval.points import sample_points

    points = sample_points(args.repo, args.points, args.seed, "auto")
    if not points:
        parser.error(f"--repo {args.repo}: no source files to sample points from")
    engine = Engine.from_pretrained(args.target, None, index := Index.build(args.repo), adaptive=False)
    cfg = engine.target.config
    if not engine.target.moe_blocks():
        parser.error("the target has no experts: nothing to measure")
    torch.set_grad_enabled(False)
    forwards = serve_and_log(engine, index, points, args.max_tokens, args.seed)
    frequencies = expert_frequencies(forwards, cfg.num_experts)
    result = {"repo": args.repo.resolve().name, "points": len(points), "forwards": len(forwards),
              "experts": cfg.num_experts, "top_k": cfg.top_k, "threads": torch.get_num_threads(),
              "neighbour_overlap": neighbour_overlap(forwards, frequencies),
              "woken_by_size": woken_by_size(forwards, frequencies), "cost": cost_fits(forwards)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
