"""Where a packed target's products spend their time: each kind of matrix, by tokens a pass.

    python -m bench.packed_products [--target FILE.gguf] [--tokens 1,4,8] [--threads 1] [--repeats 5]
                                    [--out bench/results/packed_products.json]

The target is loaded as it serves (a GGUF packed in 8-bit blocks). Every packed matrix but the
embedding is multiplied by random activations of n tokens through the native product
(`specdec_qgemm`, the kernel the probe chose), median of `repeats`, and the times are summed by
kind: the name's last part, with `8bit` added where q goes above 127 (the AVX2 sign-trick path).
"""

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from specdec import load_model
from specdec.models.model_cache import default_target
from specdec_kernels import cpu_decode


def kind_of(name: str, matrix) -> str:
    return name.split(".")[-1] + (" 8bit" if matrix.qmax > 127 else "")


def product_millis(lib, matrix, tokens: int, threads: int, repeats: int) -> float:
    kernel = cpu_decode.QKERNELS[cpu_decode.qkernel()]
    x, y = torch.randn(tokens, matrix.cols), torch.empty(tokens, matrix.rows)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        lib.specdec_qgemm(ctypes.byref(matrix.desc), x.data_ptr(), tokens, y.data_ptr(), kernel,
                          threads)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, help="a GGUF file (default: the pulled default model)")
    parser.add_argument("--tokens", default="1,4,8")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    target = args.target or default_target()[1]
    if target is None:
        parser.error("no --target, and the default model is not pulled (specdec models pull)")
    model = load_model(target, packed=True)
    lib = cpu_decode.library()
    report = {"command": " ".join(sys.argv), "kernel": cpu_decode.qkernel(), "threads": args.threads, "tokens": {}}
    for tokens in (int(n) for n in args.tokens.split(",")):
        by_kind = {}
        for name, matrix in model.packed.items():
            if name != "embed":
                kind = kind_of(name, matrix)
                by_kind[kind] = by_kind.get(kind, 0.0) + product_millis(lib, matrix, tokens, args.threads, args.repeats)
        total = sum(by_kind.values())
        report["tokens"][tokens] = {"total_ms": round(total, 2),
                                    "by_kind_ms": {k: round(v, 2) for k, v in sorted(by_kind.items())},
                                    "lm_head_share": round(by_kind.get("lm_head 8bit", by_kind.get("lm_head", 0.0)) / total, 3)}
        print(tokens, json.dumps(report["tokens"][tokens]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
