"""Running every strategy on the same completion points, interleaved, and aggregating the figures."""

import random
import sys
import time
from contextlib import contextmanager

import torch

from specdec import DEFAULT_STRATEGY, PLAIN, STRATEGY_TABLE
from specdec_eval.metrics import edit_similarity, exact_match, first_line, median, percentile
from specdec_eval.points import Point

WARMUP_POINTS = 3


DRAFTED = tuple(name for name, s in STRATEGY_TABLE.items() if s.draft)  # the strategies that another draft changes


def variant_name(strategy: str, context: str, contexts, draft: str | None = None) -> str:
    """The strategy under the first context; "strategy@context" under the others; "+draft" with
    another draft than the engine's own."""
    name = strategy if context == contexts[0] else f"{strategy}@{context}"
    return f"{name}+{draft}" if draft else name


def reference_name(name: str) -> str:
    """`ar` under the same context: what a variant's losslessness and speed are measured against."""
    name = name.split("+", 1)[0]
    return PLAIN + name[name.index("@"):] if "@" in name else PLAIN


def run_points(engine, index, points: list[Point], strategies, max_tokens: int, seed: int, progress=True,
               baselines=None, typing_along: bool = False, contexts=("auto",), drafts=None) -> dict:
    """{variant: [per-point record]}; `ar` must be among the strategies (it is the reference).
    A variant is a strategy under one of `contexts` (repository retrieval "auto" or "none").

    typing_along: each point is first completed (untimed, as the suggestion the editor shows);
    then the user types the suggestion's first TYPED_CHARS characters, and that follow-up
    request is what every strategy is timed on, each with the same suggestion in its history.

    drafts: {label: engine} of the same target with other drafts; their draft and hybrid variants
    ("hybrid+label") run interleaved with the rest, against the same `ar`."""
    rng = random.Random(seed)
    engines = {None: engine, **(drafts or {})}
    variants = [(s, c, None) for c in contexts for s in strategies]
    variants += [(s, c, label) for label in drafts or {} for c in contexts for s in strategies if s in DRAFTED]
    records = {variant_name(s, c, contexts, d): [] for s, c, d in variants}
    if baselines:
        records.update({name: [] for name in baselines.names})
    for each in engines.values():
        for point in points[:WARMUP_POINTS]:  # warm the caches and lazy measurements, untimed
            _complete(each, index, point, DEFAULT_STRATEGY, max_tokens)
        each.reset_expert_load()
        each.forget_history(None)  # the warm-up's completions must not be found again
    for i, point in enumerate(points):
        with cut_at_cursor(index, point):
            first = {}  # context -> the first request of this point: (its retrieval ms, its whole prefill ms)
            for label, each in engines.items():
                for context in contexts:  # prefill the prompt cache, like an editor's earlier keystrokes (each prompt)
                    warmed = _complete(each, index, point, DEFAULT_STRATEGY, 0, context)
                    if label is None:
                        first[context] = (warmed.stats.retrieval_ms, warmed.stats.retrieval_ms + warmed.stats.prefill_ms)
            shown = None
            if typing_along:
                point, shown = _typed_along(engine, index, point, max_tokens)
                if point is None:
                    continue
            order = list(variants)
            rng.shuffle(order)
            for strategy, context, label in order:
                each = engines[label]
                each.forget_history(None)  # no variant may find an earlier variant's answer of this point
                if shown is not None:
                    each.remember_suggestion(None, shown[0], shown[1])
                result = _complete(each, index, point, strategy, max_tokens, context)
                record = _record(point, result)
                # The timed request reuses the context an earlier keystroke's request chose, as in an
                # editor: the retrieval the point's figures report is that one, and the first
                # request's cost (retrieval and the whole prompt's prefill) is reported apart.
                chosen_ms, first_ms = first.get(context, (0.0, 0.0))
                record["retrieval_ms"] = record["retrieval_ms"] or chosen_ms
                record["first_request_ms"] = first_ms
                records[variant_name(strategy, context, contexts, label)].append(record)
            if baselines:
                reference = records[PLAIN][-1]
                for name, record in baselines.run(engine, point, reference).items():
                    records[name].append(record)
        if progress:
            bar = "#" * (30 * (i + 1) // len(points))
            print(f"\reval [{bar:<30}] {i + 1}/{len(points)} points", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return records


TYPED_CHARS = 3


def _typed_along(engine, index, point: Point, max_tokens: int):
    """(the follow-up point after typing the suggestion's first characters, (prefix, suggestion));
    (None, None) when the suggestion is too short to type along."""
    engine.forget_history(None)
    suggestion = _complete(engine, index, point, DEFAULT_STRATEGY, max_tokens).text
    if len(suggestion) <= TYPED_CHARS + 1:
        return None, None
    typed = suggestion[:TYPED_CHARS]
    truth = point.truth[len(typed):] if point.truth.startswith(typed) else point.truth
    follow = Point(point.path, point.prefix + typed, point.suffix, truth, point.mode)
    prepare_point(index, follow)
    return follow, (point.prefix, suggestion)


def prepare_point(index, point: Point) -> None:
    """The base index with this file cut at the cursor: nothing after the cursor stays visible.
    The cut is no user's edit: retrieval must not offer it as a recent one."""
    index.update(point.path, point.prefix, edited=False)


@contextmanager
def cut_at_cursor(index, point: Point):
    """prepare_point for the block, then the whole file back: later points see the repository whole."""
    prepare_point(index, point)
    try:
        yield
    finally:
        index.update(point.path, point.prefix + point.truth + point.suffix, edited=False)


def _complete(engine, index, point: Point, strategy: str, max_tokens: int, context: str = "auto"):
    return engine.complete(point.prefix, point.suffix, strategy=strategy, mode=point.mode, max_tokens=max_tokens,
                           path=point.path, context=context)


def _record(point: Point, result) -> dict:
    s = result.stats
    return {"path": point.path, "mode": point.mode, "text": result.text, "tokens": result.tokens,
            "truth": point.truth, "ms": s.total_ms, "decode_ms": s.decode_ms, "passes": s.target_passes,
            "generated": s.generated_tokens, "accepted_by_source": dict(s.accepted_by_source),
            "prefill_tokens": s.prefill_tokens, "stop_reason": s.stop_reason,
            "tree_nodes": s.tree_nodes, "draft_steps": s.draft_steps, "experts_woken": s.experts_woken,
            "context_chunks": s.context_chunks, "context_tokens": s.context_tokens, "retrieval_ms": s.retrieval_ms}


def summarize(records: dict) -> dict:
    out = {}
    for name, rows in records.items():
        reference = records[reference_name(name)] if reference_name(name) in records else records[PLAIN]
        passes = sum(r["passes"] for r in rows)
        generated = sum(r["generated"] for r in rows)
        decode_s = sum(r["decode_ms"] for r in rows) / 1000
        by_source = {}
        for r in rows:
            for source, n in r["accepted_by_source"].items():
                by_source[source] = by_source.get(source, 0) + n
        ratios = [a["ms"] / r["ms"] for a, r in zip(reference, rows, strict=True) if r["ms"] > 0]
        latencies = [r["ms"] for r in rows]
        out[name] = {
            "points": len(rows),
            "tau": generated / passes if passes else 0.0,
            "speedup_vs_ar": median(ratios),
            "tokens_per_s": generated / decode_s if decode_s else 0.0,
            "latency_ms": {"p50": percentile(latencies, 0.5), "p95": percentile(latencies, 0.95),
                           "p99": percentile(latencies, 0.99)},
            "exact_match": sum(exact_match(r["text"], r["truth"]) for r in rows) / len(rows) if rows else 0.0,
            "edit_similarity": sum(edit_similarity(r["text"], r["truth"]) for r in rows) / len(rows) if rows else 0.0,
            "first_line": _first_line_quality(rows),
            "identical_to_ar": sum(r["tokens"] == a["tokens"] for a, r in zip(reference, rows, strict=True)) / len(rows)
            if rows else 0.0,
            "accepted_by_source": by_source,
            "by_mode": _by_mode(rows, reference),
            "context": _context_summary(rows),
            "per_pass": {"tree_nodes": sum(r.get("tree_nodes", 0) for r in rows) / passes if passes else 0.0,
                         "experts_woken": sum(r.get("experts_woken", 0) for r in rows) / passes if passes else 0.0,
                         "drafted": sum(r.get("draft_steps", 0) for r in rows) / passes if passes else 0.0},
        }
    return out


def _first_line_quality(rows) -> dict:
    """Exact match and edit similarity of the first line against the truth's: what an editor
    shows first, and what a mid-line completion is all of."""
    count = max(1, len(rows))
    pairs = [(first_line(r["text"]), first_line(r["truth"])) for r in rows]
    return {"exact_match": sum(exact_match(a, b) for a, b in pairs) / count,
            "edit_similarity": sum(edit_similarity(a, b) for a, b in pairs) / count}


def _context_summary(rows) -> dict:
    """Repository context per point: chunks and tokens in the prompt, the time of the retrieval
    that chose them over the points where one ran (a context kept from a point a few lines above,
    as typing keeps it, took none), and the first request's cost (retrieval and the whole
    prompt's prefill, before any keystroke's cache)."""
    timed = [r["retrieval_ms"] for r in rows if r.get("retrieval_ms")]
    first = [r["first_request_ms"] for r in rows if r.get("first_request_ms")]
    count = max(1, len(rows))
    return {"chunks_per_point": sum(r.get("context_chunks", 0) for r in rows) / count,
            "tokens_per_point": sum(r.get("context_tokens", 0) for r in rows) / count,
            "retrieval_ms": {"p50": percentile(timed, 0.5), "p95": percentile(timed, 0.95)} if timed else None,
            "first_request_ms": {"p50": percentile(first, 0.5), "p95": percentile(first, 0.95)} if first else None}


def _by_mode(rows, reference) -> dict:
    out = {}
    for mode in ("single", "multi"):
        pairs = [(a, r) for a, r in zip(reference, rows, strict=True) if r["mode"] == mode]
        if pairs:
            passes = sum(r["passes"] for _, r in pairs)
            out[mode] = {"points": len(pairs), "tau": sum(r["generated"] for _, r in pairs) / passes if passes else 0.0,
                         "speedup_vs_ar": median([a["ms"] / r["ms"] for a, r in pairs if r["ms"] > 0]),
                         "latency_ms": {"p50": percentile([r["ms"] for _, r in pairs], 0.5),
                                        "p95": percentile([r["ms"] for _, r in pairs], 0.95)}}
    return out


def expert_load_summary(engine) -> dict:
    load = torch.tensor(engine.metrics().expert_load, dtype=torch.float32)
    if load.numel() == 0:
        return {"max_over_mean_per_layer": [], "tokens_per_expert": []}
    ratio = (load.max(dim=1).values / load.mean(dim=1).clamp(min=1e-9)).tolist()
    return {"max_over_mean_per_layer": [round(r, 3) for r in ratio], "tokens_per_expert": load.long().tolist()}


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, (time.perf_counter() - start) * 1000
