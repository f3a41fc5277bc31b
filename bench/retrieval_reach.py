"""How far retrieval can lift a completion: where the truth's first line already stands, and
whether the retrieved chunks carry it. No model runs, so a sweep of budgets takes seconds.

    python -m bench.retrieval_reach --repo REPO [--points 200] [--budgets 128,256,512,1024] [--json OUT]

At each point (eval's sampling, the index seeing the file cut at the cursor, as
bench/context_quality does), the truth's first line, stripped, counts only from MIN_LINE_CHARS
characters (shorter lines, `)` or `return x`, stand everywhere). It is classed as:
- in the file: the text before or after the cursor holds it, which the prompt's window carries;
- only elsewhere: another file of the repository holds it, and no window does; retrieval is the
  only way the prompt can carry it, so this share bounds what retrieval can add to exact match;
- nowhere: the model has to write it.
For each budget (context tokens, the engine's ContextSettings), it reports the share of the
"only elsewhere" points whose retrieved chunks hold the line (retrieval's recall of its ceiling),
and the retrieval milliseconds.
"""

import argparse
import json
import sys
import time
from pathlib import Path

from prefixcache import Index
from specdec.prompt.retrieval import CHARS_PER_TOKEN, ContextSettings
from specdec_eval.metrics import first_line, median, percentile
from specdec_eval.points import sample_points
from specdec_eval.runner import cut_at_cursor

MIN_LINE_CHARS = 12


def classify(line: str, point, texts: dict[str, str]) -> str:
    if len(line) < MIN_LINE_CHARS:
        return "short"
    if line in point.prefix or line in point.suffix:
        return "in_file"
    if any(line in text for path, text in texts.items() if path != point.path):
        return "only_elsewhere"
    return "nowhere"


def reach(index: Index, points, budgets: list[int], min_similarity: float) -> dict:
    texts = {path: "\n".join(lines) for path, lines in index.retriever.texts.items()}
    classes, found, millis = {}, {b: 0 for b in budgets}, {b: [] for b in budgets}
    for point in points:
        line = first_line(point.truth).strip()
        kind = classify(line, point, texts)
        classes[kind] = classes.get(kind, 0) + 1
        if kind != "only_elsewhere":
            continue
        with cut_at_cursor(index, point):  # nothing at or after the cursor is visible
            for budget in budgets:
                started = time.perf_counter()
                chunks = index.retrieve(point.prefix, point.suffix, path=point.path,
                                        budget_chars=int(budget * CHARS_PER_TOKEN), min_similarity=min_similarity)
                millis[budget].append((time.perf_counter() - started) * 1000)
                found[budget] += any(line in chunk.text for chunk in chunks)
    elsewhere = classes.get("only_elsewhere", 0)
    return {"points": len(points), "classes": classes,
            "budgets": {str(b): {"recall_of_only_elsewhere": found[b] / elsewhere if elsewhere else None,
                                 "found": found[b], "retrieval_ms_p50": median(millis[b]) if millis[b] else None,
                                 "retrieval_ms_p95": percentile(millis[b], 0.95) if millis[b] else None}
                        for b in budgets}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, required=True)
    p.add_argument("--points", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budgets", default="128,256,512,1024", help="context tokens, comma-separated")
    p.add_argument("--min-similarity", type=float, default=ContextSettings.min_similarity)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    try:
        budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
    except ValueError:
        p.error(f"--budgets: not a list of integers: {args.budgets!r}")
    if not args.repo.is_dir():
        p.error(f"--repo: not a directory: {args.repo}")
    index = Index.build(args.repo)
    points = sample_points(args.repo, args.points, args.seed)
    command = " ".join(["python -m bench.retrieval_reach", *(sys.argv[1:] if argv is None else argv)])
    result = {"command": command, "repo": args.repo.name, "min_line_chars": MIN_LINE_CHARS,
              **reach(index, points, budgets, args.min_similarity)}
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
