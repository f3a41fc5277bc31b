"""Repository context on a real target: what each setting completes, and what it costs to prefill.

    python -m bench.context_quality --repo REPO [--points 60] [--variants none,512,...] [--json OUT]

At each point (eval's sampling: a cursor in a real file, the real code after it as the truth; the
index sees the file cut at the cursor), each variant completes the cursor greedily with plain
decoding from an empty prompt cache, as the first request of a document does. Its first line is
scored against the truth's (exact match, edit similarity). The cost is that first request's
prefill: the prompt's tokens, its context tokens, and its milliseconds.

A variant is `none` (no retrieval) or `TOKENS[:FLOOR][:bare]`: a context budget of TOKENS, similar
windows from Jaccard FLOOR up, and `bare` for chunks without the family's repository header;
`@PROMPT` after either caps the whole prompt at PROMPT tokens (default: the engine's).
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from bench.pulled import target_or_default
from prefixcache import Index
from specdec import Engine, edit_similarity
from specdec.prompt.retrieval import ContextSettings
from specdec_eval.metrics import exact_match, first_line, median, percentile
from specdec_eval.points import sample_points


def parse_variant(name: str) -> tuple[ContextSettings | None, int | None]:
    """(None for `none`, else the settings `TOKENS[:FLOOR][:bare]` names; the prompt cap after `@`)."""
    name, _, cap = name.partition("@")
    return _settings(name), int(cap) if cap else None


def _settings(name: str) -> ContextSettings | None:
    if name == "none":
        return None
    parts = name.split(":")
    floor = float(parts[1]) if len(parts) > 1 and parts[1] else ContextSettings.min_similarity
    return ContextSettings(tokens=int(parts[0]), min_similarity=floor, repository_format="bare" not in parts[2:])


def complete(engine, point, variant: str, max_tokens: int, default_cap: int) -> dict:
    settings, cap = parse_variant(variant)
    engine.prompts.max_tokens = cap or default_cap
    engine.prompt_cache.clear()
    if settings is not None:
        engine.set_context(settings)
    started = time.perf_counter()
    result = engine.complete(point.prefix, point.suffix, strategy="ar", mode=point.mode, max_tokens=max_tokens,
                             path=point.path, context="none" if settings is None else "auto", prefetch=False)
    guess, truth = first_line(result.text), first_line(point.truth)
    return {"guess": guess, "truth": truth, "exact": exact_match(guess, truth), "similarity": edit_similarity(guess, truth),
            "prompt_tokens": result.stats.prefill_tokens, "context_tokens": result.stats.context_tokens,
            "prefill_ms": result.stats.prefill_ms, "total_ms": (time.perf_counter() - started) * 1000}


def summary(rows: list[dict]) -> dict:
    count = len(rows) or 1
    return {"points": len(rows), "exact_match": sum(r["exact"] for r in rows) / count,
            "edit_similarity": sum(r["similarity"] for r in rows) / count,
            "context_tokens_mean": sum(r["context_tokens"] for r in rows) / count,
            "prompt_tokens_p50": median([r["prompt_tokens"] for r in rows]),
            "prefill_ms_p50": median([r["prefill_ms"] for r in rows]),
            "prefill_ms_p95": percentile([r["prefill_ms"] for r in rows], 0.95)}


def run(engine, index, points, variants: list[str], max_tokens: int, progress: bool = True, report=None) -> dict:
    """{variant: summary}; report(summaries so far) after each point, so a long run keeps its figures."""
    rows = {name: [] for name in variants}
    default_cap = engine.prompts.max_tokens
    for i, point in enumerate(points):
        whole = point.prefix + point.truth + point.suffix
        index.update(point.path, point.prefix)  # nothing at or after the cursor is visible to retrieval
        for name in variants:
            rows[name].append(complete(engine, point, name, max_tokens, default_cap))
        index.update(point.path, whole)
        index.retriever.recent.clear()  # the cut above is no edit another point should see
        if report is not None:
            report({name: summary(found) for name, found in rows.items()}, rows)
        if progress:
            print(f"\r{i + 1}/{len(points)} points", end="", file=sys.stderr, flush=True)
    engine.prompts.max_tokens = default_cap
    if progress:
        print(file=sys.stderr)
    return {name: summary(found) for name, found in rows.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, required=True)
    p.add_argument("--points", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", default="none,512:0.05:bare,512,none@768,256@768,256:0.2@768")
    p.add_argument("--target", type=Path, help="default: the pulled default model")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--json", type=Path)
    p.add_argument("--rows", type=Path, help="also write every point's record here (JSON)")
    args = p.parse_args(argv)
    target = target_or_default(args.target)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for name in variants:
        parse_variant(name)  # a bad name fails before the model loads
    if args.threads:
        torch.set_num_threads(args.threads)
    index = Index.build(args.repo)
    engine = Engine.from_pretrained(target, index=index, quantize="auto", prefetch=False)
    points = sample_points(args.repo, args.points, args.seed)
    command = " ".join(["python -m bench.context_quality", *(sys.argv[1:] if argv is None else argv)])
    head = {"command": command, "repo": args.repo.name, "points": len(points), "max_tokens": args.max_tokens,
            "threads": torch.get_num_threads()}

    def write(summaries: dict, rows: dict) -> None:
        if args.json:
            args.json.write_text(json.dumps({**head, "variants": summaries}, indent=2) + "\n")
        if args.rows:
            args.rows.write_text(json.dumps(rows) + "\n")

    summaries = run(engine, index, points, variants, args.max_tokens, report=write)
    print(json.dumps({**head, "variants": summaries}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
