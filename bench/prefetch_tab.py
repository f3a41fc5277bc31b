"""The wait after Tab: a user reads a suggestion, accepts it, and the next one is asked for.

    python bench/prefetch_tab.py --repo REPO [--accepts 30] [--pause 1.5] [--json OUT]

Against a real `specdec serve` on loopback with the default model, run twice on the same points:
with prefetch and with --no-prefetch. At each point (a random line of a real file, the cursor with
at most 8 characters right of it, as llama.vim asks) the client sends llama.vim's /infill body,
shows the suggestion for --pause seconds, accepts it with Tab (the text is inserted, the cursor
moves after it) and sends the next body: the wait after Tab is that request's, client side. A
point with an empty suggestion has nothing to accept and is skipped.

The user then reads the next suggestion for --pause seconds and does something else: the cold
computation of the body sent after Tab (no prompt cache, no prefetch, no time limit), whose tokens
the answer after Tab must equal (or begin, when the request's own time limit cut it). So the
prefetches made for the second suggestion are never used: the server's /metrics give the
prefetches' outcomes and the share of their CPU time spent on work never used.
"""

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import httpx

from bench.load_server import body, prefetch_metrics, start_server, stop_server

LLAMA_VIM = {"n_predict": 128, "t_max_predict_ms": 1000, "t_max_prompt_ms": 500,
             "response_fields": None}  # llama.vim's limits once a suggestion has been shown


def points(repo: Path, count: int, seed: int) -> list:
    """(path, text, cursor) at random non-blank lines of the repository's Python files."""
    files = [(p.relative_to(repo).as_posix(), p.read_text(errors="replace"))
             for p in sorted(repo.rglob("*.py")) if p.stat().st_size > 2000]
    rng, chosen = random.Random(seed), []
    while len(chosen) < count:
        path, text = rng.choice(files)
        lines = text.split("\n")
        row = rng.randrange(len(lines))
        line = lines[row]
        indent = len(line) - len(line.lstrip())
        if not line.strip() or len(line) > 120:
            continue
        start = sum(len(x) + 1 for x in lines[:row])
        column = max(indent + 1, len(line) - rng.randint(0, 8))
        chosen.append((path, text, start + column))
    return chosen


def accept(text: str, cursor: int, suggestion: str) -> tuple[str, int]:
    """The document after Tab: the suggestion inserted at the cursor, and the rest of the line
    dropped when the suggestion typed it again (an editor replaces it)."""
    line_end = text.find("\n", cursor)
    rest = text[cursor : len(text) if line_end < 0 else line_end]
    after = text[cursor + len(rest):] if rest and suggestion.endswith(rest) else text[cursor:]
    return text[:cursor] + suggestion + after, cursor + len(suggestion)


def vim_body(text: str, cursor: int, path: str) -> dict:
    return dict(body(text, cursor, path), **LLAMA_VIM)


def run_server(args, prefetch: bool, chosen: list) -> dict:
    extra = [] if prefetch else ["--no-prefetch"]
    proc, url = start_server(args.repo, args.port, args.server_log, extra)
    try:
        with httpx.Client(timeout=120) as client:
            for path, text, cursor in chosen[:2]:  # warm-up, off the record
                client.post(f"{url}/infill", json=dict(vim_body(text, cursor, path), prefetch=False))
            accepts = []
            for path, text, cursor in chosen:
                if len(accepts) >= args.accepts:
                    break
                shown = client.post(f"{url}/infill", json=vim_body(text, cursor, path)).json()
                if not shown["content"]:
                    continue
                time.sleep(args.pause)
                after = vim_body(*accept(text, cursor, shown["content"]), path)
                started = time.perf_counter()
                answer = client.post(f"{url}/infill", json=after).json()
                record = {"wait_ms": round((time.perf_counter() - started) * 1000, 1),
                          "prefetched": answer["speculation"]["prefetched"],
                          "stop": answer["speculation"]["stop_reason"], "tokens": answer["tokens"],
                          "shown_tokens": len(shown["tokens"])}
                # The user reads the next suggestion, then does something else: the cold computation
                # of the same body (nothing cached, no prefetch, no time limit), which drops the
                # prefetches of the suggestion now shown. It comes before any other cursor of this
                # file, so the repository context retrieved for it is the one the answer had.
                time.sleep(args.pause)
                cold = dict(after, cache_prompt=False, prefetch=False, t_max_predict_ms=None)
                tokens = client.post(f"{url}/infill", json=cold).json()["tokens"]
                cut = record["stop"] == "time"
                record["cold_match"] = tokens[: len(record["tokens"])] == record["tokens"] if cut \
                    else tokens == record["tokens"]
                if not record["cold_match"]:  # kept to replay
                    record["cold_tokens"], record["cold_body"] = tokens, cold
                accepts.append(record)
            metrics = client.get(f"{url}/metrics").text
        return {"accepts": accepts, "metrics": prefetch_metrics(metrics)}
    finally:
        stop_server(proc)


def summary(run: dict) -> dict:
    waits = sorted(a["wait_ms"] for a in run["accepts"])
    pick = lambda q: waits[min(len(waits) - 1, int(q * len(waits)))] if waits else None  # noqa: E731
    outcomes = {}
    for a in run["accepts"]:
        outcomes[a["prefetched"] or "cold"] = outcomes.get(a["prefetched"] or "cold", 0) + 1
    return {"accepts": len(waits), "wait_after_tab_ms": {"p50": pick(0.5), "p90": pick(0.9), "max": waits[-1] if waits else None},
            "answered_from": outcomes, "cold_identical": sum(a["cold_match"] for a in run["accepts"]),
            "cut_by_time_limit": sum(a["stop"] == "time" for a in run["accepts"]),
            "tokens_after_tab_p50": sorted(len(a["tokens"]) for a in run["accepts"])[len(waits) // 2] if waits else None,
            "prefetch_metrics": run["metrics"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, required=True)
    p.add_argument("--accepts", type=int, default=30)
    p.add_argument("--pause", type=float, default=1.5, help="seconds a suggestion is on screen before Tab")
    p.add_argument("--port", type=int, default=8125)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    p.add_argument("--server-log", type=Path, default=Path("prefetch_tab_server.log"))
    args = p.parse_args(argv)
    chosen = points(args.repo, args.accepts * 10, args.seed)  # many points get an empty suggestion
    report = {"repo": args.repo.name, "pause_s": args.pause}
    for name, prefetch in (("prefetch", True), ("no_prefetch", False)):
        run = run_server(args, prefetch, chosen)
        report[name] = summary(run)
        report[name]["per_accept"] = [{k: a[k] for k in ("wait_ms", "prefetched", "stop", "shown_tokens", "cold_match",
                                                         "tokens", "cold_tokens", "cold_body") if k in a}
                                      for a in run["accepts"]]
    print(json.dumps({k: v if not isinstance(v, dict) else {kk: vv for kk, vv in v.items() if kk != "per_accept"}
                      for k, v in report.items()}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(report[n]["cold_identical"] == report[n]["accepts"] for n in ("prefetch", "no_prefetch")) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
