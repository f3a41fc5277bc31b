"""Figures of the trained defaults: validation loss and bpc, next-line exact match, draft-target agreement.

    python -m specdec.training.evaluate [--models DIR] [--points 200]
"""

import argparse
import json
import random
import sys
from pathlib import Path

import torch

from specdec.engine import Engine, default_model_dir
from specdec.loader import load_model
from specdec.training.corpus import load_corpus
from specdec.training.train import validation_metrics


@torch.inference_mode()
def greedy_agreement(target, draft, files, max_tokens: int = 20000, seq_len: int = 512) -> float:
    """Fraction of positions of held-out code where the draft's argmax equals the target's."""
    agree = total = 0
    for f in files:
        ids = target.tokenizer.encode(f.text).ids
        for start in range(0, len(ids) - 1, seq_len):
            chunk = torch.tensor([ids[start : start + seq_len]])
            a = target.logits(chunk).argmax(-1)
            b = draft.logits(chunk).argmax(-1)
            agree += int((a == b).sum())
            total += a.numel()
            if total >= max_tokens:
                return agree / total
    return agree / max(1, total)


def next_line_points(files, count: int, seed: int):
    """(prefix up to the line's first non-blank character, the rest of that line, the text after it)."""
    rng = random.Random(seed)
    points = []
    while len(points) < count:
        text = rng.choice(files).text
        lines = text.split("\n")
        row = rng.randrange(1, len(lines) - 1)
        line = lines[row]
        if len(line.strip()) < 4:
            continue
        start = sum(len(x) + 1 for x in lines[:row]) + len(line) - len(line.lstrip())
        end = sum(len(x) + 1 for x in lines[:row]) + len(line)
        points.append((text[max(0, start - 2000) : start], text[start:end], text[end : end + 1000]))
    return points


def next_line_exact_match(engine: Engine, points) -> float:
    hits = 0
    for prefix, truth, suffix in points:
        result = engine.complete(prefix, suffix, strategy="ar", mode="single", max_tokens=48)
        hits += result.text.rstrip() == truth.rstrip()
    return hits / len(points)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", type=Path, default=default_model_dir())
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    target, draft = load_model(args.models / "target"), load_model(args.models / "draft")
    _, validation = load_corpus()
    points = next_line_points(validation, args.points, args.seed)
    report = {}
    for name, model in (("target", target), ("draft", draft)):
        report[name] = {"validation": validation_metrics(model, model.tokenizer, validation),
                        "next_line_exact_match": next_line_exact_match(Engine(model), points)}
        print(name, json.dumps(report[name]), flush=True)
    report["draft_target_greedy_agreement"] = greedy_agreement(target, draft, validation)
    print(json.dumps(report, indent=2))
    (args.models / "evaluation.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
