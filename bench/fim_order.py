"""FIM order on a real target: what each order completes, and what one keystroke prefills.

    python bench/fim_order.py --repo REPO [--points 40] [--orders psm,spm] [--target FILE.gguf] [--json OUT]

At each point (eval's sampling: a cursor in a real file, the real code after it as the truth),
for each order: the request --typed characters earlier fills the prompt cache, then the request at
the cursor is completed greedily with plain decoding. Its first line is scored against the
truth's (exact match, edit similarity), and its prefilled tokens are what those keystrokes cost. PSM puts
the suffix after the prefix, so a keystroke prefills the suffix again; SPM puts it first, so a
keystroke prefills only what was typed. No repository context: the order alone differs.
"""

import argparse
import json
import sys
from pathlib import Path

from specdec import Engine, edit_similarity
from specdec_eval.metrics import exact_match, first_line, median
from specdec_eval.points import sample_points

# The repository root, after site-packages: bench/ is not installed.
sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench.pulled import target_or_default  # noqa: E402


def measure(engine, points, order: str, max_tokens: int, typed: int) -> dict:
    rows = []
    for point in points:
        engine.prompt_cache.clear()
        options = {"fim_mode": order, "mode": point.mode, "strategy": "ar", "path": point.path, "context": "none"}
        engine.complete(point.prefix[:-typed], point.suffix, max_tokens=1, **options)  # keystrokes before
        result = engine.complete(point.prefix, point.suffix, max_tokens=max_tokens, **options)
        guess, truth = first_line(result.text), first_line(point.truth)
        rows.append({"exact": exact_match(guess, truth), "similarity": edit_similarity(guess, truth),
                     "keystroke_prefill_tokens": result.stats.prefill_tokens, "empty": not result.text.strip()})
    count = len(rows) or 1
    return {"points": len(rows), "exact_match": sum(r["exact"] for r in rows) / count,
            "edit_similarity": sum(r["similarity"] for r in rows) / count,
            "empty": sum(r["empty"] for r in rows),
            "keystroke_prefill_tokens_p50": median([r["keystroke_prefill_tokens"] for r in rows])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, required=True)
    p.add_argument("--points", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--orders", default="psm,spm")
    p.add_argument("--target", type=Path, help="default: the pulled default model")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--typed", type=int, default=8,
                   help="characters typed since the request that filled the cache (one character often "
                        "changes no prompt token: token healing takes the last partial token back)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    target = target_or_default(args.target)
    engine = Engine.from_pretrained(target, quantize="auto")
    points = [pt for pt in sample_points(args.repo, args.points, args.seed) if len(pt.prefix) > args.typed]
    report = {"repo": args.repo.name, "points": len(points), "typed": args.typed,
              "orders": {order: measure(engine, points, order, args.max_tokens, args.typed) for order in args.orders.split(",")}}
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
