"""Would a table of the target's own next-token choices pay as a draft that costs no forward?

    python bench/target_table.py --repo REPO [--points 60] [--out bench/results/target_table.json]

The idea: run the target once over a repository's files (teacher-forced), count for every context
of 1 to 4 tokens which token it chose next, and propose the most frequent choice after the
longest context seen (backoff), with its count share as confidence. A lookup costs microseconds
where the draft's forward costs a good part of a target step, so such tokens pay wherever their
acceptance beats the verify pass's marginal cost alone.

What it measures, on the repository's adapt / held-out split (`specdec adapt`'s, by path hash):
- teacher-forced agreement with the target on held-out files, the table against the draft;
- agreement on the target's own greedy completions at held-out evaluation points, by the
  table's confidence: what the table must predict when it serves;
- the acceptance a tree token needs to pay (budget.min_useful_prob of the measured verify cost).

The first tokens of a completion are looked up after the prefix's last characters tokenized
alone, not after the engine's exact prompt, which can differ at the cut.
"""

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import torch

ORDERS = 4
WINDOW, CHUNK = 1024, 256
BUCKETS = ((0.0, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 1.01))


class ChoiceTable:
    """context (1..ORDERS tokens) -> Counter of the target's next-token choices."""

    def __init__(self):
        self.counts = defaultdict(Counter)

    def add(self, ids, choices) -> None:
        """choices[p]: the target's argmax after ids[: p + 1]."""
        for p in range(len(ids)):
            for order in range(1, ORDERS + 1):
                if p + 1 >= order:
                    self.counts[tuple(ids[p + 1 - order : p + 1])][choices[p]] += 1

    def lookup(self, context) -> tuple | None:
        """(token, count share) after the longest known tail of `context`."""
        for order in range(min(ORDERS, len(context)), 0, -1):
            found = self.counts.get(tuple(context[-order:]))
            if found:
                token, count = found.most_common(1)[0]
                return token, count / sum(found.values())
        return None


@torch.inference_mode()
def argmax_choices(model, ids: list[int]) -> list[int]:
    """The model's argmax at every position of `ids`, in windows of WINDOW tokens."""
    from specdec import Segment

    out = []
    for start in range(0, len(ids), WINDOW):
        window = ids[start : start + WINDOW]
        cache = model.new_cache(len(window))
        for c in range(0, len(window), CHUNK):
            piece = torch.tensor(window[c : c + CHUNK])
            logits = model(piece, torch.arange(c, c + len(piece)), [Segment(cache, len(piece))])
            cache.keep_all()
            out += logits.argmax(-1).tolist()
    return out


def agreement_by_bucket(rows) -> dict:
    """rows: (table confidence or -1 where it knows nothing, hit) -> shares and agreement per bucket."""
    rows = np.asarray(rows, dtype=float).reshape(-1, 2)
    out = {"positions": len(rows), "agreement": round(float(rows[:, 1].mean()), 4) if len(rows) else 0.0,
           "buckets": []}
    for lo, hi in BUCKETS:
        chosen = (rows[:, 0] >= lo) & (rows[:, 0] < hi)
        out["buckets"].append({"confidence": [lo, min(hi, 1.0)], "share": round(float(chosen.mean()), 4),
                               "agreement": round(float(rows[chosen, 1].mean()), 4) if chosen.any() else None})
    return out


def teacher_forced(table, target, draft, files, encode) -> dict:
    """Agreement with the target's argmax on `files`' own text: the table and the draft."""
    rows, draft_hits = [], []
    for f in files:
        ids = encode(f.text)
        chosen, drafted = argmax_choices(target, ids), argmax_choices(draft, ids)
        for p in range(len(ids)):
            found = table.lookup(ids[max(0, p + 1 - ORDERS) : p + 1])
            rows.append((found[1] if found else -1.0, found is not None and found[0] == chosen[p]))
            draft_hits.append(drafted[p] == chosen[p])
    report = agreement_by_bucket(rows)
    report["draft_agreement"] = round(float(np.mean(draft_hits)), 4)
    return report


def in_generation(table, engine, index, repo: Path, held: list[str], points: int) -> dict:
    """Agreement on the target's own greedy completions at held-out evaluation points."""
    from specdec_eval.points import sample_points
    from specdec_eval.runner import prepare_point

    rows = []
    for point in sample_points(repo, points, 0, "auto", files=held):
        prepare_point(index, point)
        result = engine.complete(point.prefix, point.suffix, strategy="ar", mode=point.mode, max_tokens=64,
                                 path=point.path)
        before = engine.prompts.encode(point.prefix[-200:])
        sequence = before + list(result.tokens)
        for k in range(len(before), len(sequence)):
            found = table.lookup(sequence[max(0, k - ORDERS) : k])
            rows.append((found[1] if found else -1.0, found is not None and found[0] == sequence[k]))
    return agreement_by_bucket(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--points", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from prefixcache import Index
    from specdec import Engine
    from specdec.decode.budget import min_useful_prob
    from specdec.training.adapt import repository_files, split_files

    adapt_files, held_files = split_files(repository_files(args.repo))
    index = Index.build(args.repo)
    engine = Engine.from_pretrained(None, None, index)
    encode = engine.prompts.encode
    table = ChoiceTable()
    for f in adapt_files:
        ids = encode(f.text)
        table.add(ids, argmax_choices(engine.target, ids))
    prefix = f"{args.repo.name}/"
    held = [f.path.removeprefix(prefix) for f in held_files]
    report = {"repo": args.repo.name, "adapt_files": len(adapt_files), "held_out_files": len(held_files),
              "contexts": len(table.counts),
              "teacher_forced": teacher_forced(table, engine.target, engine.draft, held_files, encode),
              "in_generation": in_generation(table, engine, index, args.repo, held, args.points)}
    report["pays_above"] = round(min_useful_prob(engine.verify_cost), 4)  # after serving corrected the curve
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
