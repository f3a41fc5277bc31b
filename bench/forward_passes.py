"""Whole target passes of n new tokens over a cached context, this tree's native library against
another build of it, in one process.

    python -m bench.forward_passes --against OTHER.so [--target FILE.gguf] [--context 800]
                                   [--tokens 1,2,4,8,16] [--rounds 11] [--out FILE.json]

The target is loaded twice, once bound to each library (the packed matrices' kernel the probe
chose, set in both), and each holds its own cache of the same real-code context. Each round
times every size on both, the order of the two alternating between rounds, so a slow spell of
the machine falls on both alike; medians over rounds. A pass of n > 1 tokens is a chain with its
tree mask, as a verify pass of one path. Before timing, both libraries' logits are compared,
and whether they are equal is reported beside the times: a build that changes a pass's numbers
is not doing the same work. packed_products times the products alone; this times what a step
pays, attention and the rest included.
"""

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.builds import other_build
from bench.pulled import target_or_default
from specdec import load_model
from specdec.models.model import Segment
from specdec_kernels import cpu_decode

SAMPLE = Path(__file__).resolve().parents[1] / "specdec" / "decode" / "scheduler.py"


def bound_to(library: ctypes.CDLL, target: Path):
    """The packed target, its native step bound to `library` (cpu_decode hands out one library)."""
    own = cpu_decode.library()
    cpu_decode._LIBRARY[0] = library
    try:
        return load_model(target, packed=True)
    finally:
        cpu_decode._LIBRARY[0] = own


def other_library(path: Path) -> ctypes.CDLL:
    """The other build, set to the packed matrices' kernel this one's probe chose."""
    other = other_build(path, cpu_decode.library(), "specdec_forward", "specdec_set_qkernel")
    other.specdec_set_qkernel(cpu_decode.QKERNELS[cpu_decode.qkernel()])
    return other


class Contender:
    def __init__(self, model, ids: torch.Tensor, context: int, largest: int):
        self.model, self.ids, self.context = model, ids, context
        self.cache = model.new_cache(context + largest)
        model(ids[:context], torch.arange(context), [Segment(self.cache, context)])
        self.cache.keep_all()

    def run(self, n: int) -> torch.Tensor:
        mask = torch.ones(n, n, dtype=torch.bool).tril() if n > 1 else None
        new = self.ids[self.context : self.context + n]
        return self.model(new, torch.arange(self.context, self.context + n), [Segment(self.cache, n, mask)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, required=True, help="another build's cpu_decode-*.so")
    parser.add_argument("--target", type=Path)
    parser.add_argument("--context", type=int, default=800)
    parser.add_argument("--tokens", default="1,2,4,8,16")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if cpu_decode.library() is None:
        sys.exit(f"no native library here: {cpu_decode.why_not()}")
    target = target_or_default(args.target)
    sizes = [int(n) for n in args.tokens.split(",")]
    torch.set_num_threads(args.threads)
    this = load_model(target, packed=True)
    tokenizer = this.tokenizer
    ids = torch.tensor(tokenizer.encode(SAMPLE.read_text()).ids[: args.context + max(sizes)])
    contenders = {"this": Contender(this, ids, args.context, max(sizes)),
                  "against": Contender(bound_to(other_library(args.against), target), ids, args.context, max(sizes))}
    same = {n: bool(torch.equal(contenders["this"].run(n), contenders["against"].run(n))) for n in sizes}
    times = {(name, n): [] for name in contenders for n in sizes}
    for r in range(args.rounds):
        for n in sizes:
            for name in (("this", "against") if r % 2 else ("against", "this")):
                started = time.perf_counter()
                contenders[name].run(n)
                times[(name, n)].append((time.perf_counter() - started) * 1000)
    rows = []
    for n in sizes:
        this_ms, other_ms = statistics.median(times[("this", n)]), statistics.median(times[("against", n)])
        rows.append({"tokens": n, "this_ms": round(this_ms, 2), "against_ms": round(other_ms, 2),
                     "ratio": round(this_ms / other_ms, 3), "same_logits": same[n]})
        print(f"{n:3d} tokens: this {this_ms:7.1f} ms  against {other_ms:7.1f} ms  ratio {this_ms / other_ms:.3f}"
              f"  same logits: {same[n]}")
    if args.out:
        report = {"command": " ".join(["python -m bench.forward_passes", *(argv or sys.argv[1:])]),
                  "target": target.name, "context": args.context, "threads": args.threads,
                  "qkernel": cpu_decode.qkernel(), "rounds": args.rounds, "passes": rows}
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
