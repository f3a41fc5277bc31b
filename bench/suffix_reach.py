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

    python bench/suffix_reach.py --repo /tmp/repos/flask-3.1.3 --points 200 --seed 0
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eval.points import SOURCE_SUFFIXES, sample_points  # noqa: E402
from prefixcache import Index  # noqa: E402
from specdec.decode.history import MATCH_LENGTHS, SELF_SEARCH_CHARS  # noqa: E402

TAILS = MATCH_LENGTHS
SELF_CHARS = SELF_SEARCH_CHARS


def first_line(text: str) -> str:
    return text.split("\n", 1)[0]


def agreed(proposal: str, truth: str) -> int:
    line, n = first_line(truth), 0
    for a, b in zip(proposal, line, strict=False):
        if a != b:
            break
        n += 1
    return n


def tail_continuations(before: str, haystacks: list[str], tails=TAILS, per_tail: int = 64) -> list[str]:
    """What followed the longest tail of `before` found in the haystacks (most frequent first)."""
    for size in tails:
        if len(before) < size:
            continue
        tail, found = before[-size:], Counter()
        for text in haystacks:
            at = text.find(tail)
            while at >= 0 and sum(found.values()) < per_tail:
                follow = first_line(text[at + size : at + size + 200])
                if follow:
                    found[follow] += 1
                at = text.find(tail, at + 1)
        if found:
            return [text for text, _ in found.most_common(8)]
    return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-chars", type=int, default=8)
    args = parser.parse_args()
    points = sample_points(args.repo, args.points, args.seed)
    files = {p.relative_to(args.repo).as_posix(): p.read_text(errors="replace") for p in sorted(args.repo.rglob("*"))
             if p.suffix in SOURCE_SUFFIXES and p.is_file()}
    index = Index.build(args.repo)
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
    report = {"repo": args.repo.name, "points": len(points), "seed": args.seed, "min_chars": args.min_chars,
              "hits": dict(hits), "mean_chars": {k: round(v / max(1, len(points)), 2) for k, v in chars.items()}}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
