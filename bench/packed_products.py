"""Where a packed target's products spend their time: each kind of matrix, by tokens a pass.

    python -m bench.packed_products [--target FILE.gguf] [--tokens 1,4,8] [--threads 1] [--repeats 5]
                                    [--against OTHER.so] [--out bench/results/packed_products.json]

The target is loaded as it serves (a GGUF packed in 8-bit blocks). Every packed matrix but the
embedding is multiplied by random activations of n tokens through the native product
(`specdec_qgemm`, the kernel the probe chose), and the times are summed by kind: the name's last
part, with `8bit` added where q goes above 127 (the AVX2 sign-trick path). A round takes the
matrices in the model's order, once each, as a step does, so that each comes from memory as it
does in service (timing one matrix over and over would find it in the CPU's cache); each kind
keeps its median over `repeats` rounds.

`--against` names another build of the native library (an older `cpu_decode-*.so` from the
native cache): the rounds then alternate between it and this tree's build, in one process over
the same matrices, so that both meet the same machine; each gets its own medians, and the report
gives this build's time over the other's.
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
from specdec_kernels import cpu_decode


def kind_of(name: str, matrix) -> str:
    return name.split(".")[-1] + (" 8bit" if matrix.qmax > 127 else "")


def product_millis(lib, matrix, x: torch.Tensor, y: torch.Tensor, kernel: int, threads: int) -> float:
    arguments = (ctypes.byref(matrix.desc), x.data_ptr(), x.shape[0], y.data_ptr(), kernel, threads)
    started = time.perf_counter()
    lib.specdec_qgemm(*arguments)
    return (time.perf_counter() - started) * 1000


def products_by_kind(libs: list, matrices: dict, tokens: int, repeats: int, threads: int) -> list[dict]:
    """For each library, {kind: median over rounds of the kind's summed product time (ms)}; the
    libraries take turns, a round each."""
    kernel = cpu_decode.QKERNELS[cpu_decode.qkernel()]
    buffers = {name: (torch.randn(tokens, m.cols), torch.empty(tokens, m.rows)) for name, m in matrices.items()}
    rounds = [[] for _ in libs]
    for _ in range(repeats):
        for lib, kept in zip(libs, rounds, strict=True):
            by_kind = {}
            for name, matrix in matrices.items():
                kind = kind_of(name, matrix)
                millis = product_millis(lib, matrix, *buffers[name], kernel, threads)
                by_kind[kind] = by_kind.get(kind, 0.0) + millis
            kept.append(by_kind)
    return [{kind: statistics.median(r[kind] for r in kept) for kind in sorted(kept[0])} for kept in rounds]


def summary(by_kind: dict) -> dict:
    total = sum(by_kind.values())
    head = sum(ms for kind, ms in by_kind.items() if kind.startswith("lm_head"))
    return {"total_ms": round(total, 2), "by_kind_ms": {k: round(v, 2) for k, v in by_kind.items()},
            "lm_head_share": round(head / total, 3)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, help="a GGUF file (default: the pulled default model)")
    parser.add_argument("--tokens", default="1,4,8")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--against", type=Path, help="another build of the native library, timed in turns")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    target = target_or_default(args.target)
    model = load_model(target, packed=True)
    lib = cpu_decode.library()
    libs = [lib] + ([other_build(args.against, lib, "specdec_qgemm")] if args.against else [])
    report = {"command": " ".join(sys.argv), "kernel": cpu_decode.qkernel(), "threads": args.threads, "tokens": {}}
    matrices = {name: m for name, m in model.packed.items() if name != "embed"}
    for tokens in (int(n) for n in args.tokens.split(",")):
        timed = [summary(by_kind) for by_kind in products_by_kind(libs, matrices, tokens, args.repeats, args.threads)]
        report["tokens"][tokens] = timed[0]
        if args.against:
            report["tokens"][tokens] |= {"against": timed[1],
                                         "ratio": round(timed[0]["total_ms"] / timed[1]["total_ms"], 3)}
        print(tokens, json.dumps(report["tokens"][tokens]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
