"""One decode step of the target and of the draft, and the target's verify cost by tree size,
alone and batched with other requests.

    python bench/step_cost.py [--models DIR] [--context 512] [--repeats 30] [--batches 1,4,8]
                              [--out bench/results/step_cost.json]

Both models are timed interleaved in one process on real code tokens (this repository's own
scheduler.py), median of `repeats`; the draft's budget is a fraction of a target step. Batched:
B requests, each over its own cached context of real code at a different offset, stepped in
ONE forward with n tokens each (a chain, as a tree's path): what n tree tokens per request cost
once B requests' tokens already wake most experts.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from specdec import Segment, default_model_dir, load_model

SAMPLE = Path(__file__).resolve().parents[1] / "specdec" / "decode" / "scheduler.py"


@torch.inference_mode()
def step_ms(model, ids, context: int, new: int = 1) -> float:
    cache = model.new_cache(context + new)
    model(ids[:context], torch.arange(context), [Segment(cache, context)])
    cache.keep_all()
    started = time.perf_counter()
    model(ids[context : context + new], torch.arange(context, context + new), [Segment(cache, new)])
    return (time.perf_counter() - started) * 1000


@torch.inference_mode()
def batch_step_ms(model, ids, context: int, batch: int, new: int) -> float:
    tokens, positions, segments = [], [], []
    for b in range(batch):
        offset = (b * 97) % max(1, len(ids) - context - new)
        window = ids[offset : offset + context + new]
        cache = model.new_cache(context + new)
        model(window[:context], torch.arange(context), [Segment(cache, context)])
        cache.keep_all()
        tokens.append(window[context:])
        positions.append(torch.arange(context, context + new))
        segments.append(Segment(cache, new))
    started = time.perf_counter()
    model(torch.cat(tokens), torch.cat(positions), segments)
    return (time.perf_counter() - started) * 1000


@torch.inference_mode()
def _head_times(args, target, ids) -> list:
    """One drafting step of an EAGLE-3 head (its own output fed back), if the models have one."""
    from specdec.models.eagle import is_eagle3, load_eagle3

    if not is_eagle3(args.models / "head"):
        return []
    head = load_eagle3(args.models / "head", target)
    width, times = 3 * head.config.target_hidden_size, []
    for _ in range(args.repeats):
        cache = head.new_cache(args.context + 2)
        _, hidden = head(ids[1 : args.context + 1], torch.randn(args.context, width), torch.arange(1, args.context + 1),
                         cache)
        started = time.perf_counter()
        head(ids[args.context : args.context + 1], hidden[-1:], torch.tensor([args.context + 1]), cache, fused=True)
        times.append((time.perf_counter() - started) * 1000)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=Path, default=default_model_dir())
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", default="1,4,8", help="requests stepped together, comma-separated")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, draft = load_model(args.models / "target"), load_model(args.models / "draft")
    ids = torch.tensor(target.tokenizer.encode(SAMPLE.read_text()).ids)
    times = {"target": [], "draft": []}
    sizes = (1, 2, 4, 8, 16, 32)
    verify = {n: [] for n in sizes}
    for _ in range(args.repeats):
        for name, model in (("target", target), ("draft", draft)):
            times[name].append(step_ms(model, ids, args.context))
        for n in sizes:
            verify[n].append(step_ms(target, ids, args.context, n))
    batches = [int(b) for b in args.batches.split(",") if b]
    batched = {b: {n: [] for n in (1, 4, 8)} for b in batches}
    for _ in range(max(5, args.repeats // 3)):
        for b in batches:
            for n in (1, 4, 8):
                batched[b][n].append(batch_step_ms(target, ids, args.context, b, n))
    head_times = _head_times(args, target, ids)
    if head_times:
        times["head"] = head_times
    report = {"models": str(args.models.name), "context": args.context, "threads": args.threads,
              "step_ms": {k: round(statistics.median(v), 3) for k, v in times.items()},
              "verify_ms": {n: round(statistics.median(v), 3) for n, v in verify.items()},
              # {requests: {tokens per request: ms of the one forward}}
              "batch_step_ms": {b: {n: round(statistics.median(v), 3) for n, v in row.items()}
                                for b, row in batched.items()}}
    for b, row in report["batch_step_ms"].items():  # what speculation costs on top of a plain batched step
        report.setdefault("batch_tree_overhead", {})[b] = {n: round(row[n] / row[1], 3) for n in row}
    for name in ("draft", "head"):
        if name in report["step_ms"]:
            report[f"{name}_over_target"] = round(report["step_ms"][name] / report["step_ms"]["target"], 3)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
