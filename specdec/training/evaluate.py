"""Figures of trained models on held-out packages: bits per character, next-line exact match, the
copy test, FIM splices that parse, and draft-target agreement.

    python -m specdec.training.evaluate [--models DIR] [--points 200] [--out DIR/evaluation.json]
    python -m specdec.training.evaluate --target FILE.gguf|DIR [--packed] --out FILE.json   # one model, no draft

Every figure is on packages never trained on (corpus.HELD_OUT), at points drawn with a fixed seed:
- bits_per_char: the first 1,024 tokens of 40 files, no header;
- next_line_exact_match: the prefix up to a line's first non-blank character, the rest of the line
  completed exactly (single-line mode, the file's following text as suffix), and
  next_line_edit_similarity, 1 - Levenshtein distance / the longer length, on the same completions;
- copy_test: lines that repeat an earlier line of the same file exactly, given the text before
  the line and its first 4 characters; `naive_copier` is the most recent earlier line with the
  same indentation and first 4 characters, for scale, and `naive_copier_in_window` the same copier
  limited to the PREFIX_CHARS the model is given (the fair bar: it sees what the model sees);
- repeat_recall: argmax accuracy on a 200-token window of held-out code given twice in a row, on
  the second copy (`first`: on the first, for contrast). A model with induction heads copies the
  second almost perfectly; one that only models code scores about what it does on the first;
- fim_parses: a block completed at a line start (multi-line mode), spliced into a file that
  parses, still parses;
- draft_agreement: positions of held-out code where the draft's argmax equals the target's.
"""

import argparse
import ast
import hashlib
import json
import random
import sys
from pathlib import Path

import torch

from specdec.engine import Engine, default_model_dir
from specdec.models.eagle import is_eagle3, load_eagle3
from specdec.models.loader import load_model
from specdec.textmetrics import edit_similarity
from specdec.training.corpus import load_corpus
from specdec.training.train import validation_metrics

PREFIX_CHARS = 4000  # of text before the cursor given to the engine (it keeps what fits)
SUFFIX_CHARS = 1000


def by_hash(files):
    return sorted(files, key=lambda f: hashlib.sha1(f.path.encode()).digest())


@torch.inference_mode()
def draft_agreement(target, draft, files, max_tokens: int = 20000, seq_len: int = 1024) -> float:
    agree = total = 0
    for f in by_hash(files):
        ids = target.tokenizer.encode(f.text).ids[:seq_len]
        if len(ids) < 2:
            continue
        chunk = torch.tensor([ids])
        agree += int((target.logits(chunk).argmax(-1) == draft.logits(chunk).argmax(-1)).sum())
        total += len(ids)
        if total >= max_tokens:
            break
    return agree / max(1, total)


def _line_offsets(text: str) -> list[int]:
    offsets, at = [], 0
    for line in text.split("\n"):
        offsets.append(at)
        at += len(line) + 1
    return offsets


@torch.inference_mode()
def head_agreement(target, head, files, max_tokens: int = 20000, seq_len: int = 1024) -> dict:
    """Positions where an EAGLE-3 head's first and second draft tokens equal the target's argmax."""
    from specdec.training.eagle3 import head_loss

    first = second = total = 0
    for f in by_hash(files):
        ids = target.tokenizer.encode(f.text).ids[: seq_len + 1]
        if len(ids) < 8:
            continue
        batch = torch.tensor([ids])
        _, (agree0, agree1) = head_loss(head, target, batch)
        n = len(ids) - 3
        first, second, total = first + float(agree0) * n, second + float(agree1) * n, total + n
        if total >= max_tokens:
            break
    return {"step0": first / max(1, total), "step1": second / max(1, total)}


def next_line_points(files, count: int, seed: int):
    """(prefix up to the line's first non-blank character, the rest of that line, the text after it)."""
    rng = random.Random(seed)
    points, files = [], by_hash(files)
    while len(points) < count:
        text = rng.choice(files).text
        lines = text.split("\n")
        if len(lines) < 3:
            continue
        row = rng.randrange(1, len(lines) - 1)
        line = lines[row]
        if len(line.strip()) < 4:
            continue
        begin = _line_offsets(text)[row]
        start, end = begin + len(line) - len(line.lstrip()), begin + len(line)
        points.append((text[max(0, start - PREFIX_CHARS) : start], text[start:end], text[end : end + SUFFIX_CHARS]))
    return points


def copy_points(files, count: int, seed: int, given: int = 4):
    """(prefix with the line's first `given` characters, the rest of the line, suffix, naive copier's guess)."""
    candidates = []
    for f in by_hash(files):
        lines, seen = f.text.split("\n"), {}
        for row, line in enumerate(lines):
            body = line.strip()
            if len(body) >= given + 6 and line in seen:
                candidates.append((f, row, _naive_copy(lines, row, given)))
            seen.setdefault(line, row)
    rng = random.Random(seed)
    points = []
    for f, row, naive in rng.sample(candidates, min(count, len(candidates))):
        line, begin = f.text.split("\n")[row], _line_offsets(f.text)[row]
        cut = begin + len(line) - len(line.lstrip()) + given
        end = begin + len(line)
        points.append((f.text[max(0, cut - PREFIX_CHARS) : cut], f.text[cut:end], f.text[end : end + SUFFIX_CHARS], naive))
    return points


def _naive_copy(lines, row: int, given: int) -> str | None:
    line = lines[row]
    return _copy_from(lines[:row], line[: len(line) - len(line.lstrip()) + given])


def _naive_copy_in_window(prefix: str) -> str | None:
    """The naive copier over the lines the model is given; the prefix ends with the line's head."""
    lines = prefix.split("\n")
    if len(prefix) >= PREFIX_CHARS:
        lines = lines[1:]  # the window cut into its first line
    return _copy_from(lines[:-1], lines[-1]) if lines else None


def _copy_from(earlier_lines, head: str) -> str | None:
    """The rest of the most recent earlier line that starts with `head`."""
    for earlier in reversed(earlier_lines):
        if earlier.startswith(head):
            return earlier[len(head) :]
    return None


@torch.inference_mode()
def repeat_recall(model, files, windows: int = 20, size: int = 200) -> dict:
    """Argmax accuracy on the first and the second of two copies of a window (first 10 tokens skipped)."""
    first = second = 0.0
    used = 0
    for f in by_hash(files):
        ids = model.tokenizer.encode(f.text).ids
        if len(ids) < 2 * size:
            continue
        start = len(ids) // 3
        chunk = torch.tensor([ids[start : start + size] * 2])
        hits = (model.logits(chunk)[0, :-1].argmax(-1) == chunk[0, 1:]).float()
        first += hits[10 : size - 1].mean().item()
        second += hits[size + 10 :].mean().item()
        used += 1
        if used == windows:
            break
    return {"first": first / max(1, used), "second": second / max(1, used), "windows": used}


def _hit_rate(guesses, points) -> float:
    hits = sum(guess is not None and guess.rstrip() == truth.rstrip()
               for guess, (_, truth, *_) in zip(guesses, points, strict=True))
    return hits / max(1, len(points))


def line_rates(engine: Engine, points, mode: str = "single") -> dict:
    """Exact match and edit similarity of the completed rest of each point's line."""
    hits = similarity = 0.0
    for prefix, truth, suffix, *_ in points:
        text = engine.complete(prefix, suffix, strategy="ar", mode=mode, max_tokens=48).text.rstrip()
        hits += text == truth.rstrip()
        similarity += edit_similarity(text, truth.rstrip())
    count = max(1, len(points))
    return {"exact_match": hits / count, "edit_similarity": similarity / count}


def fim_parse_rate(engine: Engine, files, count: int, seed: int) -> float:
    rng = random.Random(seed)
    parsing = [f for f in by_hash(files) if _parses(f.text)]
    ok = total = 0
    while total < count:
        text = rng.choice(parsing).text
        offsets = _line_offsets(text)
        row = rng.randrange(1, len(offsets))
        cut = offsets[row]
        prefix, suffix = text[:cut], text[cut:]
        after = suffix.find("\n", 0)
        suffix = suffix[after + 1 :] if rng.random() < 0.5 and after >= 0 else suffix  # a removed line or an insert
        result = engine.complete(prefix[-PREFIX_CHARS:], suffix[:SUFFIX_CHARS], strategy="ar", mode="multi", max_tokens=64)
        ok += _parses(prefix + result.text + suffix)
        total += 1
    return ok / count


def _parses(text: str) -> bool:
    try:
        ast.parse(text)
        return True
    except (SyntaxError, ValueError):
        return False


def model_figures(name: str, model, files, line_points, copies, points: int, seed: int) -> dict:
    """One model's figures, each printed to stderr when done (a real model takes hours)."""
    engine = Engine(model)
    measures = (
        lambda: {"bits_per_char": validation_metrics(model, model.tokenizer, files[:40], max_tokens=10**9)["bits_per_char"]},
        lambda: {f"next_line_{key}": value for key, value in line_rates(engine, line_points).items()},
        lambda: {"copy_test": line_rates(engine, copies)["exact_match"]},
        lambda: {"fim_parses": fim_parse_rate(engine, files, max(20, points // 4), seed)},
        lambda: {"repeat_recall": repeat_recall(model, files)},
    )
    report = {}
    for measure in measures:
        for figure, value in measure().items():
            report[figure] = value
            print(name, figure, json.dumps(value), file=sys.stderr, flush=True)
    return report


def evaluate(target, draft, held_out, points: int, seed: int, head=None) -> dict:
    files = by_hash(held_out)
    line_points = next_line_points(files, points, seed)
    copies = copy_points(files, points, seed)
    report = {"held_out_files": len(files), "points": points, "copy_points": len(copies)}
    report["naive_copier"] = _hit_rate([naive for *_, naive in copies], copies)
    report["naive_copier_in_window"] = _hit_rate([_naive_copy_in_window(prefix) for prefix, *_ in copies], copies)
    for name, model in (("target", target), ("draft", draft)):
        if model is None:
            continue
        report[name] = model_figures(name, model, files, line_points, copies, points, seed)
    if target is not None and draft is not None:
        report["draft_agreement"] = draft_agreement(target, draft, files)
    if target is not None and head is not None:
        report["head_agreement"] = head_agreement(target, head, files)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=Path, default=default_model_dir(), help="a directory with target/ and draft/")
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="where the corpus cache is")
    parser.add_argument("--out", type=Path, help="write the figures here (default: MODELS/evaluation.json)")
    parser.add_argument("--run", type=Path, help="a training run directory (its checkpoint) as the target")
    parser.add_argument("--bpc-only", action="store_true", help="only bits per character (comparing shapes)")
    parser.add_argument("--target", type=Path, help="evaluate this model alone (a .gguf file or an HF directory)")
    parser.add_argument("--packed", action="store_true",
                        help="the --target GGUF file's weights packed in 8-bit blocks, as served by default")
    args = parser.parse_args(argv)
    if args.target and not args.out:
        parser.error("--target needs --out (the shipped models' evaluation.json is theirs)")
    _, held_out = load_corpus(args.runs / "corpus" / "downloads")
    if args.run:
        target = checkpoint_model(args.run)
        bpc = validation_metrics(target, target.tokenizer, by_hash(held_out)[:40], max_tokens=10**9)
        print(json.dumps({"run": str(args.run), **bpc}))
        if args.bpc_only:
            return 0
        models = {"target": target, "draft": None}
    elif args.target:
        models = {"target": load_model(args.target, packed=args.packed), "draft": None}
    else:
        models = {}
        for name in ("target", "draft"):
            path = args.models / name
            models[name] = load_model(path) if (path / "config.json").exists() else None
    if models["target"] is None:
        raise SystemExit(f"{args.models}/target: no model there")
    head = None
    if not args.run and not args.target and is_eagle3(args.models / "head"):
        head = load_eagle3(args.models / "head", models["target"])
    report = evaluate(models["target"], models["draft"], held_out, args.points, args.seed, head)
    text = json.dumps(report, indent=2) + "\n"
    print(text)
    if args.out or not args.run:
        (args.out or args.models / "evaluation.json").write_text(text)
    return 0


def checkpoint_model(run_dir: Path):
    """The model of a training run's checkpoint, loaded as the engine loads an exported one."""
    import tempfile

    from specdec.training.__main__ import export_model, tokenizer_of_defaults
    from specdec.training.train import run_model

    model, raw, _ = run_model(run_dir)
    with tempfile.TemporaryDirectory() as tmp:
        export_model(model, raw, tokenizer_of_defaults(), Path(tmp))
        return load_model(tmp)


if __name__ == "__main__":
    sys.exit(main())
