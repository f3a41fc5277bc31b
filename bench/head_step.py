"""An EAGLE-3 head's drafting step against its target's decode step, on a real target.

    python -m bench.head_step [--target FILE.gguf] [--vocabs 2048,8192,32768] [--context 512] [--repeats 40]

The target runs as it serves (a GGUF packed in 8-bit blocks, the native step); each head is a
head of the target's shape (one layer, the draft vocabulary's LM head) with random weights, which
cost what trained ones do, timed eager in fp32 (`head_V`) and packed as load_eagle3 packs it for
a packed target (`packed_head_V`). With --dense, also a dense draft of the target's first and last
layers and the same draft vocabulary (specdec.models.dense_draft), run as load_dense_draft runs it
(`dense_V`: packed for a packed target), its logits over the whole vocabulary included as the
draft runner reads them. One token per step over `context` cached positions, timed interleaved,
medians. A head's step costs its draft depth times per speculation, so its ratio to the target's
step is what the adaptive engine weighs against the tokens it may win.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.pulled import target_or_default
from specdec import Segment, load_model
from specdec.models.dense_draft import load_dense_draft
from specdec.models.eagle import pack_for_cpu
from specdec.models.quantize import loads_packed
from specdec.training.dense_draft import build_dense_draft, dense_draft_config, save_dense_draft
from specdec.training.eagle3 import build_head, head_config


@torch.inference_mode()
def target_step(model, context: int):
    cache = model.new_cache(context + 1)
    ids = torch.randint(0, model.config.vocab_size, (context + 1,))
    model(ids[:context], torch.arange(context), [Segment(cache, context)])
    cache.keep_all()

    def step() -> float:
        cache.truncate(context)
        started = time.perf_counter()
        model(ids[context:], torch.arange(context, context + 1), [Segment(cache, 1)])
        return (time.perf_counter() - started) * 1000
    return step


@torch.inference_mode()
def head_step(head, context: int):
    cache = head.new_cache(context + 1)
    width = 3 * head.config.target_hidden_size
    head(torch.zeros(context, dtype=torch.long), torch.randn(context, width), torch.arange(context), cache)
    token, hidden = torch.tensor([1]), torch.randn(1, head.config.hidden_size)

    def step() -> float:
        cache.truncate(context)
        started = time.perf_counter()
        head(token, hidden, torch.tensor([context]), cache, fused=True)
        return (time.perf_counter() - started) * 1000
    return step


def dense_draft(target, vocab: int):
    """A dense draft of the target's first and last layers, as served (packed with a packed target)."""
    with tempfile.TemporaryDirectory() as folder:
        raw = dense_draft_config(target.config, vocab)
        save_dense_draft(build_dense_draft(raw, target, torch.zeros(vocab, dtype=torch.long)), Path(folder))
        return load_dense_draft(folder, target)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", type=Path, help="default: the pulled default model")
    p.add_argument("--vocabs", default="2048,8192,32768")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--dense", action="store_true", help="also time a dense draft per vocabulary")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    path = target_or_default(args.target)
    target = load_model(path, packed=loads_packed(path, "auto")).train(False)
    steps = {"target": target_step(target, args.context)}
    for vocab in (int(v) for v in args.vocabs.split(",")):
        raw = head_config(target.config, draft_vocab=vocab)
        steps[f"head_{vocab}"] = head_step(build_head(raw, target).eval(), args.context)
        packed = build_head(raw, target).eval()
        if pack_for_cpu(packed, target):
            steps[f"packed_head_{vocab}"] = head_step(packed, args.context)
        if args.dense:
            steps[f"dense_{vocab}"] = target_step(dense_draft(target, vocab), args.context)
    times = {name: [] for name in steps}
    for _ in range(3):  # warm caches and lazy setup
        for step in steps.values():
            step()
    for _ in range(args.repeats):
        for name, step in steps.items():
            times[name].append(step())
    medians = {name: statistics.median(values) for name, values in times.items()}
    report = {"target": path.name, "context": args.context, "threads": torch.get_num_threads(),
              "median_ms": medians, "head_over_target": {n: m / medians["target"] for n, m in medians.items()}}
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
