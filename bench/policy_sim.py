"""Which trees would pay: every source's proposals at every position of `ar`'s completions,
and speculation policies replayed over them at the step costs that served steps measured.

    python bench/policy_sim.py --repo REPO [--points 200] [--cost-points 60] [--out FILE]
                               [--positions FILE: the logged run, kept to replay again]

Greedy decoding is deterministic, so a tree's outcome at a position needs no target pass: the
target accepts the longest proposed path that `ar`'s own tokens begin with. One forced run
with every step kept plain logs, at each position, what the trie, the history (by tail length)
and the draft propose, what the lookups and draft forwards cost, and how sure the target was
of the token just committed. A policy is then replayed point by point: at each position it
picks sources and a tree (the engine's own grow_tree, its acceptance estimates fitted on the
other half of the points), is charged the step and its proposing, and moves past the tokens
the tree had right.

Step costs are not the start-up curve: served steps of adaptive hybrid and `ar`, alternating
point by point, are timed whole (proposing, forward, acceptance) by tree size; a size served too
rarely lies between well-measured ones, and beyond the largest the verify curve's growth is
added. The oracle knows
each position's outcome and verifies only the path that pays best; it bounds every policy here.
"""

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

# After site-packages: the repository's folders (kernels/, server/, eval/) must not shadow installed packages.
sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench.acceptance_oracle import interpolate  # noqa: E402
from specdec.decode.drafting import common_prefix  # noqa: E402

MIN_SAMPLES = 20  # served steps of one tree size before its median replaces the curve's growth
CONFIDENT = (0.5, 0.8, 0.95)  # buckets of the target's probability of its last token
DRAFT_PROB = (0.2, 0.4, 0.6, 0.8, 0.95)  # buckets of the draft's own cumulative probability


# logging ----------------------------------------------------------------------------------

def log_positions(forced, plain, index, points, max_tokens: int = 64) -> list[dict]:
    """Per point: `ar`'s times and tokens, and per position (every step kept plain on `forced`,
    an Engine(adaptive=False) with a draft) each source's paths, lookup and draft times, and
    the target's top-2 probabilities of the token it committed there."""
    from specdec.decode import generation, proposing
    from specdec.decode.drafting import DraftPath, branch_paths, trie_paths
    from specdec.decode.history import MATCH_LENGTHS
    from specdec_eval.runner import prepare_point

    steps, current = [], {}
    Generation = generation.Generation
    saved = proposing._paths, proposing.grow_tree, Generation.commit

    def every_source(self, ctx, acceptance, draft=True):  # every source, whatever the step would draft
        current.clear()
        current["position"] = len(self.generated)
        healed = self.healing_left
        started = time.perf_counter()
        found = [DraftPath(f"trie:{rank}", p.tokens, p.probs) for rank, p in enumerate(trie_paths(
            ctx.index, self.options.prefix + self.text, self.options.path, ctx.prompts.encode, healed,
            acceptance))]
        current["trie_ms"] = _since(started)
        started = time.perf_counter()
        for length in MATCH_LENGTHS:
            found += [DraftPath(f"history:{length}", p.tokens, p.probs) for p in proposing._history_paths(self, ctx, acceptance, [length])]
        current["history_ms"] = _since(started)
        proposing._catch_up(self)
        first = self.healing.allowed if self.healing_pending else None
        started = time.perf_counter()
        tokens, probs = self.draft.chain(self.committed, ctx.draft_depth, proposing.FORCED_DRAFT_FLOOR, first,
                                         ctx.prompts.stop_ids)
        current["draft_ms"], current["draft_forwards"] = _since(started), len(self.draft.alternatives)
        found.append(DraftPath("draft", tokens, probs))
        found += [DraftPath("draft:branch", b, p) for b, p in branch_paths(tokens, probs, self.draft.alternatives)]
        return found

    def log_tree(tree, paths, *args, **kwargs):  # the tree stays the root alone: a plain step
        current["paths"] = [(p.source, list(p.tokens), [round(x, 4) for x in p.probs]) for p in paths]

    def log_commit(self, tree, logits, *args, **kwargs):
        current["confidence"] = _top_two(logits[0])
        steps.append(dict(current))
        return saved[2](self, tree, logits, *args, **kwargs)

    proposing._paths, proposing.grow_tree, Generation.commit = every_source, log_tree, log_commit
    rows = []
    try:
        for i, point in enumerate(points):
            prepare_point(index, point)
            for engine in (plain, forced):
                engine.complete(point.prefix, point.suffix, mode=point.mode, max_tokens=0, path=point.path)
                engine.forget_history(None)
            ar = plain.complete(point.prefix, point.suffix, strategy="ar", mode=point.mode, max_tokens=max_tokens,
                                path=point.path)
            steps.clear()
            logged = forced.complete(point.prefix, point.suffix, strategy="hybrid", mode=point.mode,
                                     max_tokens=max_tokens, path=point.path)
            rows.append({"ar_ms": ar.stats.total_ms, "ar_decode_ms": ar.stats.decode_ms, "tokens": list(ar.tokens),
                         "same": logged.tokens == ar.tokens, "steps": list(steps)})
            print(f"\rpositions: {i + 1}/{len(points)} points", end="", file=sys.stderr, flush=True)
    finally:
        proposing._paths, proposing.grow_tree, Generation.commit = saved
    print(file=sys.stderr)
    return rows


def served_step_ms(plain, adaptive, index, points, max_tokens: int = 64) -> dict:
    """{tree size: (median ms of a whole scheduler step less its proposing, steps)}: size 1 from
    `ar`'s plain steps, larger sizes from adaptive hybrid's steps that did not draft (the
    lookups' trees); the two engines alternate point by point."""
    from specdec.decode import generation, scheduler
    from specdec_eval.runner import prepare_point

    times, current = defaultdict(list), {}
    Generation, Scheduler = generation.Generation, scheduler.Scheduler
    saved = Generation.propose, Scheduler.step

    def sized(self, riding=0):
        started = time.perf_counter()
        tree = saved[0](self, riding)
        current["size"], current["plain"], current["drafting"] = len(tree), not self.options.sources.speculates, \
            self.drafting
        current["proposing_ms"] = _since(started)
        return tree

    def timed(self):
        current.clear()
        started = time.perf_counter()
        saved[1](self)
        # ar's plain steps, and hybrid's trees of the lookups alone, less their proposing: the
        # replay charges a step's proposing (trie lookups, draft forwards) apart
        if "size" in current and not current["drafting"] and current["plain"] == (current["size"] == 1):
            times[current["size"]].append(_since(started) - current["proposing_ms"])

    Generation.propose, Scheduler.step = sized, timed
    try:
        for i, point in enumerate(points):
            prepare_point(index, point)
            for engine, strategy in ((plain, "ar"), (adaptive, "hybrid"))[:: 1 if i % 2 == 0 else -1]:
                engine.complete(point.prefix, point.suffix, mode=point.mode, max_tokens=0, path=point.path)
                engine.forget_history(None)
                engine.complete(point.prefix, point.suffix, strategy=strategy, mode=point.mode, max_tokens=max_tokens,
                                path=point.path)
            print(f"\rserved steps: {i + 1}/{len(points)} points", end="", file=sys.stderr, flush=True)
    finally:
        Generation.propose, Scheduler.step = saved
    print(file=sys.stderr)
    return {n: (statistics.median(found), len(found)) for n, found in sorted(times.items())}


def _since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def _top_two(logits) -> list:
    """The two largest probabilities of a row of logits, largest first."""
    import numpy as np

    values = np.asarray(logits, dtype=np.float64)
    probs = np.exp(values - values.max())
    probs /= probs.sum()
    return sorted(np.partition(probs, -2)[-2:].tolist(), reverse=True)


# costs ------------------------------------------------------------------------------------

def step_costs(served: dict, curve: dict, largest: int = 64) -> list:
    """[cost(0), cost(1), ..., cost(largest)] in ms: the served medians of sizes served at least
    MIN_SAMPLES times (and of plain steps), linear between them, then the verify curve's growth
    beyond the largest; never decreasing."""
    trusted = [n for n, (_, count) in sorted(served.items()) if n == 1 or count >= MIN_SAMPLES]
    known = {n: served[n][0] for n in trusted}
    last = trusted[-1]
    costs = [known[1]]
    for n in range(1, largest + 1):
        cost = interpolate(known, n) if n <= last else known[last] + interpolate(curve, n) - interpolate(curve, last)
        costs.append(max(cost, costs[-1]))
    return costs


# acceptance estimates ---------------------------------------------------------------------

def kind(source: str) -> str:
    """trie, draft (its chain and its branches), or history:<tail length>."""
    return source if source.startswith("history") else source.split(":")[0]


def _bucket(value, edges) -> int:
    if value is None:
        return -1
    return sum(value >= edge for edge in edges)


class AcceptanceTable:
    """P(a path's token k is accepted | its tokens before are), counted over logged positions
    by source kind, depth (3 and deeper together), first step or not, the target's confidence
    in its last token, and for the draft its own probability, for the trie the candidate's rank."""

    def __init__(self, rows):
        self.counts = defaultdict(lambda: [0, 0])
        for row in rows:
            previous = None
            for step in row["steps"]:
                ahead = row["tokens"][step["position"] :]
                for source, tokens, probs in step["paths"]:
                    followed = common_prefix(tokens, ahead)
                    for k in range(min(len(tokens), followed + 1)):
                        count = self.counts[self.key(source, k, step["position"], previous, probs[k])]
                        count[0] += k < followed
                        count[1] += 1
                previous = step["confidence"][0]

    @staticmethod
    def key(source: str, depth: int, position: int, confidence, prob: float) -> tuple:
        if kind(source) == "draft":  # the chain and its runner-up branches apart
            return (source, min(depth, 3), position == 0, _bucket(confidence, CONFIDENT), _bucket(prob, DRAFT_PROB))
        base = (kind(source), min(depth, 3), position == 0, _bucket(confidence, CONFIDENT))
        if source.startswith("trie"):
            return base + (source != "trie:0",)
        return base

    def chance(self, source: str, depth: int, position: int, confidence, prob: float) -> float:
        accepted, seen = self.counts.get(self.key(source, depth, position, confidence, prob), (0, 0))
        return (accepted + 0.5) / (seen + 2)  # a key never seen is priced at a quarter: a guess, not a sure token


def calibration(rows) -> list[dict]:
    """How often paths' first tokens were followed at later steps (not a completion's first): the
    draft's by its own probability, the trie's and history's by the target's confidence in its
    last token (the draft's chain only). What a policy could tell before the pass."""
    groups = defaultdict(lambda: [0, 0])
    for row in rows:
        previous = None
        for step in row["steps"]:
            ahead = row["tokens"][step["position"] :]
            for source, tokens, probs in step["paths"] if step["position"] else ():
                if not tokens or source == "draft:branch":  # an empty chain; a branch repeats its chain's start
                    continue
                followed = common_prefix(tokens, ahead) > 0
                if source == "draft":
                    key = ("draft", "its own probability", _bucket(probs[0], DRAFT_PROB), DRAFT_PROB)
                else:
                    key = (kind(source), "target's confidence", _bucket(previous, CONFIDENT), CONFIDENT)
                groups[key][0] += followed
                groups[key][1] += 1
            previous = step["confidence"][0]
    return [{"source": source, "by": by, "from": ([0.0] + list(edges))[bucket], "paths": seen,
             "first_followed": round(followed / seen, 3)}
            for (source, by, bucket, edges), (followed, seen) in sorted(groups.items())]


# replay -----------------------------------------------------------------------------------

class _Costs:
    """The cost table in the shape grow_tree reads."""

    def __init__(self, costs: list):
        self.costs = costs

    def table(self, largest: int) -> list:
        return self.costs[: largest + 1]


def accepted_length(tree, tokens: list) -> int:
    node = depth = 0
    while depth < len(tokens) and tokens[depth] in tree.children[node]:
        node = tree.children[node][tokens[depth]]
        depth += 1
    return depth


def replay(rows, policy, costs: list) -> dict:
    """Per point: positions are stepped as the policy's trees allow; `ar`'s decode time is
    scaled by the replayed cost over plain steps' (cost(1) each), prefill as `ar` measured."""
    per_point, plain_all, spent_all, passes, speculated = [], 0.0, 0.0, 0, 0
    for row in rows:
        steps, position, spent = row["steps"], 0, 0.0
        while position < len(steps):
            confidence = steps[position - 1]["confidence"][0] if position else None
            ahead = row["tokens"][position:]
            tree, proposing_ms = policy(steps[position], confidence, costs, tokens=ahead)
            accepted = min(accepted_length(tree, ahead), len(steps) - 1 - position)
            spent += costs[len(tree)] + proposing_ms
            speculated += len(tree) > 1
            position += accepted + 1
            passes += 1
        plain = len(steps) * costs[1]
        plain_all, spent_all = plain_all + plain, spent_all + spent
        if plain > 0 and row["ar_ms"] > 0:
            decode = row["ar_decode_ms"] * spent / plain
            per_point.append(row["ar_ms"] / (row["ar_ms"] - row["ar_decode_ms"] + decode))
    tokens = sum(len(row["steps"]) for row in rows)
    return {"per_point_median": round(statistics.median(per_point), 4), "decode": round(plain_all / spent_all, 4),
            "tau": round(tokens / passes, 3), "speculating_steps": round(speculated / passes, 3)}


def draft_ms(step: dict, depth: int) -> float:
    """The draft forwards needed to propose `depth` tokens (and learn it should stop there)."""
    forwards = max(1, step["draft_forwards"])
    return step["draft_ms"] / forwards * min(depth + 1, forwards)


def oracle(step: dict, confidence, costs: list, tokens=None):
    """Knows the outcome: verifies only the best path's accepted tokens, where that pays."""
    from specdec.decode.tree import TokenTree

    tree = TokenTree(0)
    best, best_rate, best_path = 0, 1.0 / costs[1], None
    for source, path, _ in step["paths"]:
        followed = common_prefix(path, tokens)
        extra = draft_ms(step, followed) if kind(source) == "draft" else 0.0
        rate = (followed + 1) / (costs[followed + 1] + extra) if followed else 0.0
        if rate > best_rate:
            best, best_rate, best_path = followed, rate, (source, path, extra)
    if best_path is None:
        return tree, 0.0
    node = 0
    for token in best_path[1][:best]:
        node = tree.add_child(node, token, best_path[0], 1.0)
    return tree, best_path[2]


def gated(table: AcceptanceTable, history=("history:48", "history:24"), trie_first=False, draft_first=False,
          draft_when=None, draft_cost=1.0):
    """A policy that sees only what a step knows before its pass: history paths of the given
    tail lengths at every step; the trie at the first step (trie_first); the draft at the first
    step (draft_first) and wherever the target's last token had at least `draft_when` of its
    probability; each node priced by `table`, the tree grown by the engine's grow_tree on the
    served costs. The draft is charged its forwards up to the deepest draft node kept."""
    from specdec.decode.budget import grow_tree
    from specdec.decode.drafting import DraftPath
    from specdec.decode.tree import TokenTree

    def policy(step, confidence, costs, tokens=None):
        first = step["position"] == 0
        drafting = (first and draft_first) or (draft_when is not None and confidence is not None
                                               and confidence >= draft_when)
        paths, proposing_ms = [], step["history_ms"]
        for source, path, probs in step["paths"]:
            wanted = (source in history or (source.startswith("trie") and first and trie_first)
                      or (kind(source) == "draft" and drafting))
            if wanted and path:
                chance, chances = 1.0, []
                for k, prob in enumerate(probs):
                    chance *= table.chance(source, k, step["position"], confidence, prob)
                    chances.append(chance)
                paths.append(DraftPath(source, path, chances))
        proposing_ms += step["trie_ms"] if first and trie_first else 0.0
        tree = TokenTree(0)
        if paths:
            grow_tree(tree, paths, _Costs(costs), max_nodes=len(costs) - 1)
        if drafting:
            deepest = max((tree.depths[n] for n in range(1, len(tree)) if kind(tree.sources[n]) == "draft"), default=0)
            proposing_ms += draft_ms(step, deepest) * draft_cost
        return tree, proposing_ms

    return policy


# the run ----------------------------------------------------------------------------------

def policies(table: AcceptanceTable) -> dict:
    twelve = ("history:48", "history:24", "history:12")
    return {
        "repeats 48/24 (the engine's plain steps before 0c72c6c)": gated(table),
        "repeats 48/24/12": gated(table, twelve),
        "repeats 48/24/12, trie at the first step": gated(table, twelve, trie_first=True),
        "repeats, first-step trie, and the draft where the target was sure (0.99)": gated(table, twelve, True, True, draft_when=0.99),
        "repeats, first-step trie, and the draft at every step": gated(table, twelve, True, True, draft_when=0.0),
        "repeats, first-step trie, and a draft at every step that cost nothing": gated(table, twelve, True, True, draft_when=0.0, draft_cost=0.0),
    }


def evaluate(rows, costs: list) -> dict:
    """The oracle on all points; each policy fitted on one half of the points and replayed on
    the other, both ways."""
    halves = (rows[0::2], rows[1::2])
    found = {"oracle": [replay(rows, oracle, costs)]}
    for fit, test in (halves, halves[::-1]):
        for name, policy in policies(AcceptanceTable(fit)).items():
            found.setdefault(name, []).append(replay(test, policy, costs))
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--cost-points", type=int, default=60, help="points whose served steps are timed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--positions", type=Path,
                        help="where the logged positions and served costs are kept (JSON): read if it exists, else written")
    args = parser.parse_args(argv)
    from prefixcache import Index
    from specdec import Engine
    from specdec.engine import default_model_dir
    from specdec.models.loader import load_model
    from specdec_eval.points import sample_points

    if args.positions and args.positions.exists():
        logged = json.loads(args.positions.read_text())
    else:
        index = Index.build(args.repo)
        models = default_model_dir()
        target, draft = load_model(models / "target"), load_model(models / "draft")
        plain, forced = Engine(target, draft, index), Engine(target, draft, index, adaptive=False)
        points = sample_points(args.repo, args.points, args.seed, "auto")
        served = served_step_ms(plain, Engine(target, draft, index), index, points[: args.cost_points])
        logged = {"rows": log_positions(forced, plain, index, points), "served": served, "curve": plain.verify_costs()}
        if args.positions:
            args.positions.write_text(json.dumps(logged))
    rows = logged["rows"]
    served = {int(n): tuple(found) for n, found in logged["served"].items()}
    curve = {int(n): ms for n, ms in logged["curve"].items()}
    costs = step_costs(served, curve)
    report = {"repo": args.repo.name, "points": len(rows), "identical_to_ar": sum(r["same"] for r in rows),
              "positions": sum(len(r["steps"]) for r in rows), "verify_ms": curve,
              "served_step_ms": {n: {"median": round(ms, 3), "steps": count} for n, (ms, count) in served.items()},
              "step_costs_ms": [round(c, 3) for c in costs[1:17]], "policies": evaluate(rows, costs),
              "calibration": calibration(rows)}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
