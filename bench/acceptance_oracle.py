"""How fast could hybrid be with these sources if it knew, before verifying, which tokens the
target will accept?

    python bench/acceptance_oracle.py --repo REPO [--points 200] [--out bench/results/acceptance_oracle.json]

Forced trees (Engine(adaptive=False): every source's paths, up to the node budget) show pass by
pass which proposed tokens the target accepts. An oracle that verified exactly those tokens (no
rejected node ever priced, the draft run only as deep as its deepest accepted token) bounds what
any policy choosing trees from these sources could reach:
- a pass that accepted a tokens costs cost(a + 1) from the engine's measured verify curve, its
  extra over a plain step scaled by --served-scale (served trees wake experts that the start-up
  loop kept in cache) plus --python-ms of a speculating step's own work;
- a drafted token costs the measured draft/target step ratio of a step;
- per point, `ar`'s decode time is scaled by the oracle's cost over plain decoding's, and the
  prefill and the rest stay as `ar` measured them.

Also, per proposed path: how often the target followed its first token and how deep, by source,
at a completion's first step and later. Those are what a policy must predict to get near the bound.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

from specdec.decode import budget
from specdec.decode.drafting import common_prefix


def log_forced(forced, plain, index, points, max_tokens: int = 64) -> list[dict]:
    """Per point: `ar`'s times (on `plain`), and the forced hybrid's passes (accepted (source,
    depth) pairs) and proposed paths (source, first step or not, tokens followed, length)."""
    from specdec.decode import generation, proposing
    from specdec_eval.runner import prepare_point

    accept, propose, commit = generation.accept, proposing._paths, generation.Generation.commit
    passes, paths, step = [], [], {}

    def logged_accept(tree, *args, **kwargs):
        result = accept(tree, *args, **kwargs)
        passes.append([(tree.sources[n], tree.depths[n]) for n in result.nodes])
        return result

    def logged_paths(self, ctx, acceptance):
        step["paths"], step["first"] = propose(self, ctx, acceptance), not self.generated
        return step["paths"]

    def logged_commit(self, tree, *args, **kwargs):
        before = len(self.committed)
        added = commit(self, tree, *args, **kwargs)
        new = self.committed[before:]
        for path in step.pop("paths", ()):
            followed = common_prefix(path.tokens, new)
            paths.append({"source": path.source, "first_step": step["first"], "followed": followed,
                          "length": len(path.tokens)})
        return added

    generation.accept, proposing._paths, generation.Generation.commit = logged_accept, logged_paths, logged_commit
    rows = []
    try:
        for i, point in enumerate(points):
            prepare_point(index, point)
            for engine in (plain, forced):
                engine.complete(point.prefix, point.suffix, mode=point.mode, max_tokens=0, path=point.path)
                engine.forget_history(None)
            ar = plain.complete(point.prefix, point.suffix, strategy="ar", mode=point.mode, max_tokens=max_tokens,
                                path=point.path)
            passes.clear(), paths.clear()
            hybrid = forced.complete(point.prefix, point.suffix, strategy="hybrid", mode=point.mode,
                                     max_tokens=max_tokens, path=point.path)
            rows.append({"ar_ms": ar.stats.total_ms, "ar_decode_ms": ar.stats.decode_ms, "passes": list(passes),
                         "paths": list(paths), "same": ar.text == hybrid.text})
            print(f"\r{i + 1}/{len(points)} points", end="", file=sys.stderr, flush=True)
    finally:
        generation.accept, proposing._paths, generation.Generation.commit = accept, propose, commit
    print(file=sys.stderr)
    return rows


def interpolate(curve: dict, n: int) -> float:
    """cost(n) from {size: ms}, as the engine interpolates its verify curve."""
    sizes = sorted(curve)
    return budget.interpolate(sizes, [curve[size] for size in sizes], n)


def oracle(rows, curve: dict, draft_ratio: float, served_scale: float = 1.0, python_ms: float = 0.0) -> dict:
    """The oracle's speedup over `ar`: per point (median, as the evaluation reports it) and over
    the decode time of all points; tau is the forced run's."""
    plain_step, per_point, plain_all, oracle_all, tokens, count = curve[1], [], 0.0, 0.0, 0, 0
    for row in rows:
        plain = spent = 0.0
        for accepted in row["passes"]:
            n = len(accepted)
            drafted = max((depth for source, depth in accepted if source == "draft"), default=0)
            plain += (n + 1) * plain_step
            spent += plain_step if n == 0 else (plain_step + (interpolate(curve, n + 1) - plain_step) * served_scale
                                                + python_ms + drafted * draft_ratio * plain_step)
            tokens, count = tokens + n + 1, count + 1
        plain_all, oracle_all = plain_all + plain, oracle_all + spent
        if plain > 0 and row["ar_ms"] > 0:
            decode = row["ar_decode_ms"] * spent / plain
            per_point.append(row["ar_ms"] / (row["ar_ms"] - row["ar_decode_ms"] + decode))
    return {"served_scale": served_scale, "python_ms": python_ms,
            "per_point_median": round(statistics.median(per_point), 4) if per_point else None,
            "decode": round(plain_all / oracle_all, 4) if oracle_all else None,
            "tau": round(tokens / count, 4) if count else None}


def path_acceptance(rows) -> list[dict]:
    """Per (source, first step or later): paths, P(first token followed), tokens followed on average."""
    groups: dict = {}
    for row in rows:
        for path in row["paths"]:
            groups.setdefault((path["source"], path["first_step"]), []).append(path)
    return [{"source": source, "step": "first" if first else "later", "paths": len(found),
             "first_followed": round(sum(p["followed"] > 0 for p in found) / len(found), 4),
             "mean_followed": round(sum(p["followed"] for p in found) / len(found), 3),
             "mean_length": round(sum(p["length"] for p in found) / len(found), 2)}
            for (source, first), found in sorted(groups.items())]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from prefixcache import Index
    from specdec import Engine
    from specdec.engine import default_model_dir
    from specdec.models.loader import load_model
    from specdec_eval.points import sample_points

    index = Index.build(args.repo)
    models = default_model_dir()
    target, draft = load_model(models / "target"), load_model(models / "draft")
    plain, forced = Engine(target, draft, index), Engine(target, draft, index, adaptive=False)
    rows = log_forced(forced, plain, index, sample_points(args.repo, args.points, args.seed, "auto"))
    curve = {int(n): ms for n, ms in plain.verify_costs().items()}
    ratio = plain.draft_min_prob  # the draft's step over the target's, as warm_up measured it (floored at 0.05)
    report = {"repo": args.repo.name, "points": len(rows), "identical_to_ar": sum(r["same"] for r in rows),
              "verify_ms": curve, "draft_ratio": round(ratio, 4),
              "oracle": [oracle(rows, curve, ratio, scale, py) for scale, py in ((1.0, 0.0), (1.26, 0.1), (1.5, 0.2))],
              "paths": path_acceptance(rows)}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
