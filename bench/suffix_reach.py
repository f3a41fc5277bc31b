"""How often a suffix match over the repository would catch a completion that the index's
trie and the text's own repeats miss: the question that decides whether a SuffixDecoding-style
draft is worth adding (issue: drafts that fit a real target).

No model runs. At the eval's completion points, each source proposes a continuation from the
text before the cursor and the score is the characters of the ground truth's first line that it
gets right from the start:
  trie     prefixcache's candidates for the unit under the cursor (best of its top 8), the point's
           file indexed up to the cursor as the eval does;
  self     the engine's history source on the text itself: the longest tail (48, 24 or 12
           characters) found earlier in the text, and what followed it there;
  suffix   the same search over the rest of the repository's files and the text after the
           cursor (what the editor sends), longest tail first, the most frequent continuation;
  after cursor  the same over the text after the cursor alone.
A source "hits" a point when it gets at least `--min-chars` of the line right.

    python -m bench.suffix_reach --repo /tmp/repos/flask-3.1.3 --points 200 --seed 0

--replay RUN (an eval run's directory, with `ar` among its strategies) asks the sources at every
token of `ar`'s completions instead, the target's own text: a source's proposal there is worth as
many of the next tokens as it spells out from the start. Passes are then counted as a tree of
`--budget` proposed tokens would take them (the best source's tokens, at most the budget, plus
the bonus token), with the trie and the engine's history search (the text before and after the
cursor) alone, and with the repository-wide search added: the tau those sources reach without a
model, and what the repository search adds to it.
"""

import argparse
import bisect
import json
from collections import Counter
from pathlib import Path

from bench.pulled import target_or_default
from prefixcache import Index
from specdec.decode.history import MATCH_LENGTHS, SELF_SEARCH_CHARS, SuggestionHistory
from specdec_eval.points import SOURCE_SUFFIXES, sample_points

TAILS = MATCH_LENGTHS
SELF_CHARS = SELF_SEARCH_CHARS


def first_line(text: str) -> str:
    return text.split("\n", 1)[0]


def common_chars(a: str, b: str) -> int:
    """How many characters `a` and `b` share from the start."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def agreed(proposal: str, truth: str) -> int:
    return common_chars(proposal, first_line(truth))


def tail_continuations(before: str, haystacks: list[str], tails=TAILS, per_tail: int = 64, lines: bool = True,
                       chars: int = 200) -> list[str]:
    """What followed the longest tail of `before` found in the haystacks (most frequent first):
    the rest of its line, or (lines False) its next `chars` characters, counted by that line."""
    for size in tails:
        if len(before) < size:
            continue
        tail, found, whole = before[-size:], Counter(), {}
        for text in haystacks:
            at = text.find(tail)
            while at >= 0 and sum(found.values()) < per_tail:
                follow = text[at + size : at + size + chars]
                line = first_line(follow)
                if line:
                    found[line] += 1
                    whole.setdefault(line, follow)
                at = text.find(tail, at + 1)
        if found:
            return [line if lines else whole[line] for line, _ in found.most_common(8)]
    return []


def tokens_spelled(proposals, rest: str, ends: list[int]) -> int:
    """How many of the next tokens (their end offsets in `rest`) the best proposal spells out."""
    best = max((common_chars(proposal, rest) for proposal in proposals), default=0)
    return bisect.bisect_right(ends, best)


def passes_needed(spelled: list[int], budget: int) -> int:
    """Passes to produce every token when a pass at token j takes min(spelled[j], budget) of them
    and the target's own next token."""
    at = count = 0
    while at < len(spelled):
        at += min(spelled[at], budget) + 1
        count += 1
    return count


def replay_point(index, point, pieces: list[str], others: list[str]) -> tuple[list[int], list[int]]:
    """Per token of the completion `pieces`: the tokens the trie and the history search spell out,
    and the same with the repository-wide search added."""
    completion, ends, start = "".join(pieces), [], 0
    for piece in pieces:
        start += len(piece)
        ends.append(start)
    engine, widened = [], []
    for j in range(len(pieces)):
        done = ends[j - 1] if j else 0
        text, rest = point.prefix + completion[:done], completion[done:]
        relative = [end - done for end in ends[j:]]
        proposals = [c.text for c in index.propose(text, point.path, k=6)]
        proposals += [c for c, _ in SuggestionHistory().continuations(None, text[-SELF_CHARS:],
                                                                        after=point.suffix[:SELF_CHARS])]
        spelled = tokens_spelled(proposals, rest, relative)
        found = tail_continuations(text, [point.suffix, *others], lines=False, chars=320)[:3]
        engine.append(spelled)
        widened.append(max(spelled, tokens_spelled(found, rest, relative)))
    return engine, widened


def reach_report(args, points, files: dict, index) -> dict:
    hits, chars = Counter(), Counter()
    for point in points:
        index.update(point.path, point.prefix, edited=False)
        got = {
            "trie": max((agreed(c.text, point.truth) for c in index.propose(point.prefix, point.path)), default=0),
            "self": max((agreed(c, point.truth) for c in tail_continuations(point.prefix, [point.prefix[-SELF_CHARS:-1]])),
                        default=0),
            "suffix": max((agreed(c, point.truth) for c in tail_continuations(
                point.prefix, [point.suffix] + [t for path, t in files.items() if path != point.path])), default=0),
            "after cursor": max((agreed(c, point.truth) for c in tail_continuations(point.prefix, [point.suffix])),
                                default=0),
        }
        index.update(point.path, point.prefix + point.truth + point.suffix, edited=False)
        hit = {name for name, n in got.items() if n >= args.min_chars and first_line(point.truth).strip()}
        for name in hit:
            hits[name] += 1
        for name, n in got.items():
            chars[name] += n
        if "suffix" in hit and not hit & {"trie", "self"}:
            hits["suffix only"] += 1
        if "after cursor" in hit and not hit & {"trie", "self"}:
            hits["after cursor only"] += 1
        if hit & {"trie", "self"} and "suffix" not in hit:
            hits["trie or self only"] += 1
    return {"min_chars": args.min_chars, "hits": dict(hits),
            "mean_chars": {k: round(v / max(1, len(points)), 2) for k, v in chars.items()}}


def ar_rows(run: Path) -> tuple[dict, list[dict]]:
    """An eval run's results and `ar`'s per-point records (points.jsonl holds each variant's rows in turn)."""
    try:
        results = json.loads((run / "results.json").read_text())
        names = list(results["strategies"])
        lines = (run / "points.jsonl").read_text().splitlines()
    except (OSError, ValueError, KeyError) as error:
        raise SystemExit(f"{run}: not an eval run's directory ({error})") from None
    if "ar" not in names or len(lines) % len(names):
        raise SystemExit(f"{run}: no `ar` rows to replay (strategies: {', '.join(names)})")
    per = len(lines) // len(names)
    return results, [json.loads(line) for line in lines[names.index("ar") * per : (names.index("ar") + 1) * per]]


def replay_report(args, points, files: dict, index) -> dict:
    from specdec.models.gguf_checkpoint import GgufCheckpoint
    from specdec.models.gguf_tokenizer import tokenizer_from_gguf

    run, rows = ar_rows(args.replay)
    if run.get("typing_along"):
        raise SystemExit(f"{args.replay}: a typing-along run's points are not the sampled ones; replay another")
    target = args.target or (Path(run["target"]) if run.get("target") else None)
    tokenizer = tokenizer_from_gguf(GgufCheckpoint(target_or_default(target)))
    if [(r["path"], r["truth"]) for r in rows] != [(p.path, p.truth) for p in points]:
        raise SystemExit(f"{args.replay}: its points are not --points {args.points} --seed {args.seed} of {args.repo}")
    engine = widened = tokens = 0
    for row, point in zip(rows, points, strict=True):
        index.update(point.path, point.prefix, edited=False)
        others = [t for path, t in files.items() if path != point.path]
        alone, added = replay_point(index, point, [tokenizer.decode([t]) for t in row["tokens"]], others)
        index.update(point.path, point.prefix + point.truth + point.suffix, edited=False)
        engine += passes_needed(alone, args.budget)
        widened += passes_needed(added, args.budget)
        tokens += len(alone)
    return {"replay": args.replay.name, "budget": args.budget, "tokens": tokens,
            "tau": {"trie and history": round(tokens / max(1, engine), 3),
                    "with the repository search": round(tokens / max(1, widened), 3)}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-chars", type=int, default=8)
    parser.add_argument("--replay", type=Path, help="an eval run's directory: replay its `ar` completions")
    parser.add_argument("--budget", type=int, default=3, help="proposed tokens a replayed pass verifies")
    parser.add_argument("--target", type=Path, help="the GGUF whose tokenizer split the run (default: the run's)")
    args = parser.parse_args()
    points = sample_points(args.repo, args.points, args.seed)
    files = {p.relative_to(args.repo).as_posix(): p.read_text(errors="replace") for p in sorted(args.repo.rglob("*"))
             if p.suffix in SOURCE_SUFFIXES and p.is_file()}
    index = Index.build(args.repo)
    body = replay_report(args, points, files, index) if args.replay else reach_report(args, points, files, index)
    print(json.dumps({"repo": args.repo.name, "points": len(points), "seed": args.seed, **body}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
