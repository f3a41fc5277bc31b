"""One-command GPU check and timing of the Triton kernels against PyTorch baselines.

    python bench/gpu_kernels.py [--out log.json]        # on a CUDA machine
    TRITON_INTERPRET=1 python bench/gpu_kernels.py --dry-run   # tiny shapes on the CPU, to check the script

For each shape (the default model's and Qwen3-30B-A3B's MoE layers) and batch of 1..256 tokens:
correctness against the PyTorch path, then median time of the Triton kernel and of the PyTorch
baseline, with achieved GB/s (weights of the experts touched + activations) and TFLOP/s, next to
the measured copy-bandwidth and bf16 matmul ceilings of the device.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

import specdec_kernels as kernels  # noqa: E402
from specdec_kernels.attention_torch import tree_attention_torch  # noqa: E402
from specdec_kernels.moe_torch import fused_moe_torch, moe_route_torch  # noqa: E402
from specdec_kernels.mxfp4 import dequantize_mxfp4, quantize_mxfp4, uses_dot_scaled  # noqa: E402
from specdec_kernels.triton_attention import tree_attention_triton  # noqa: E402
from specdec_kernels.triton_moe import fused_moe_triton, moe_route_triton  # noqa: E402

MOE_SHAPES = {"default-model": (8, 2, 256, 512), "qwen3-30b-a3b": (128, 8, 2048, 768)}  # E, top_k, H, I
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def timed(fn, device, repeats=20) -> float:
    """Median milliseconds of fn()."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1000)
    return sorted(times)[len(times) // 2]


def ceilings(device, dry: bool) -> dict:
    n = 1 << (20 if dry else 28)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_ms = timed(lambda: dst.copy_(src), device, 5 if dry else 20)
    size = 256 if dry else 8192
    dtype = torch.float32 if dry else torch.bfloat16
    a = torch.randn(size, size, device=device, dtype=dtype)
    mm_ms = timed(lambda: a @ a, device, 3 if dry else 20)
    return {"copy_GBps": 2 * n / copy_ms / 1e6, "matmul_TFLOPs": 2 * size**3 / mm_ms / 1e9, "matmul_dtype": str(dtype)}


def moe_case(name, shape, tokens, dtype, device, fp8=False) -> dict:
    experts, top_k, hidden, inter = shape
    x = torch.randn(tokens, hidden, device=device).to(dtype)
    w1 = (torch.randn(experts, 2 * inter, hidden, device=device) / hidden**0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, device=device) / inter**0.5).to(dtype)
    logits = torch.randn(tokens, experts, device=device)
    weights, ids = moe_route_triton(logits, top_k, True)
    ref_w, ref_ids = moe_route_torch(logits, top_k, True)
    route_ok = bool(torch.equal(ids, ref_ids))
    kwargs, ref_w1, ref_w2 = {}, w1, w2
    if fp8:
        s1 = w1.float().abs().amax(2) / 448
        s2 = w2.float().abs().amax(2) / 448
        q1, q2 = (w1.float() / s1[..., None]).to(torch.float8_e4m3fn), (w2.float() / s2[..., None]).to(torch.float8_e4m3fn)
        kwargs = {"w1_scale": s1, "w2_scale": s2}
        ref_w1, ref_w2 = (q1.float() * s1[..., None]).to(dtype), (q2.float() * s2[..., None]).to(dtype)
        w1, w2 = q1, q2
    got = fused_moe_triton(x, w1, w2, weights, ids, **kwargs)
    ref = fused_moe_torch(x, ref_w1, ref_w2, ref_w, ref_ids)
    err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    triton_ms = timed(lambda: fused_moe_triton(x, w1, w2, weights, ids, **kwargs), device)
    torch_ms = timed(lambda: fused_moe_torch(x, ref_w1, ref_w2, ref_w, ref_ids), device)
    touched = int(torch.unique(ids).numel())
    weight_bytes = touched * 3 * hidden * inter * w1.element_size()
    flops = 2 * tokens * top_k * 3 * hidden * inter
    return {"kernel": "fused_moe", "shape": name, "tokens": tokens, "dtype": "fp8_e4m3" if fp8 else str(dtype),
            "route_exact": route_ok, "rel_err": err, "triton_ms": triton_ms, "torch_ms": torch_ms,
            "speedup": torch_ms / triton_ms, "GBps": (weight_bytes + 2 * x.numel() * x.element_size()) / triton_ms / 1e6,
            "TFLOPs": flops / triton_ms / 1e9}


def mxfp4_case(name, shape, tokens, device) -> dict:
    """MXFP4 experts through the public entry point: dot_scaled on Blackwell (and in the
    interpreter), dequantise-then-bf16 elsewhere; `path` says which ran."""
    experts, top_k, hidden, inter = shape
    dtype = torch.float16 if device.type == "cpu" else torch.bfloat16
    x = torch.randn(tokens, hidden, device=device).to(dtype)
    p1, s1 = quantize_mxfp4(torch.randn(experts, 2 * inter, hidden, device=device) / hidden**0.5)
    p2, s2 = quantize_mxfp4(torch.randn(experts, hidden, inter, device=device) / inter**0.5)
    weights, ids = moe_route_torch(torch.randn(tokens, experts, device=device), top_k, True)
    d1, d2 = dequantize_mxfp4(p1, s1, dtype), dequantize_mxfp4(p2, s2, dtype)
    kernels.set_backend("triton")
    try:
        run = lambda: kernels.fused_moe(x, p1, p2, weights, ids, w1_scale=s1, w2_scale=s2)  # noqa: E731
        got = run()
        ours_ms = timed(run, device)
    finally:
        kernels.set_backend("auto")
    ref = fused_moe_torch(x.float(), d1.float(), d2.float(), weights, ids)
    err = ((got.float() - ref).abs().max() / ref.abs().max()).item()
    torch_ms = timed(lambda: fused_moe_torch(x, d1, d2, weights, ids), device)
    touched = int(torch.unique(ids).numel())
    packed_bytes = touched * 3 * hidden * inter * (0.5 + 1 / 32)
    return {"kernel": "fused_moe", "shape": name, "tokens": tokens, "dtype": "mxfp4",
            "path": "dot_scaled" if uses_dot_scaled(x) else "dequantise", "rel_err": err, "triton_ms": ours_ms,
            "torch_ms": torch_ms, "speedup": torch_ms / ours_ms, "GBps": packed_bytes / ours_ms / 1e6}


def attention_case(batch, tree, cache, device, dtype, heads=(32, 4), dim=128) -> dict:
    hq, hkv = heads
    q = torch.randn(batch, hq, tree, dim, device=device).to(dtype)
    k = torch.randn(batch, hkv, cache + tree, dim, device=device).to(dtype)
    v = torch.randn_like(k)
    lens = [cache - 7 * i for i in range(batch)]
    mask = torch.ones(tree, tree, dtype=torch.bool, device=device).tril().expand(batch, tree, tree).contiguous()
    got = tree_attention_triton(q, k, v, lens, mask)
    ref = tree_attention_torch(q, k, v, lens, mask)
    err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    triton_ms = timed(lambda: tree_attention_triton(q, k, v, lens, mask), device)
    torch_ms = timed(lambda: tree_attention_torch(q, k, v, lens, mask), device)
    kv_bytes = 2 * sum(lens) * hkv * dim * k.element_size()
    return {"kernel": "tree_attention", "batch": batch, "tree": tree, "cache": cache, "dtype": str(dtype), "rel_err": err,
            "triton_ms": triton_ms, "torch_ms": torch_ms, "speedup": torch_ms / triton_ms, "GBps": kv_bytes / triton_ms / 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes, fp32, any device (for the interpreter)")
    args = parser.parse_args()
    dry = args.dry_run
    device = torch.device("cuda" if torch.cuda.is_available() and not dry else "cpu")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("no GPU: run with TRITON_INTERPRET=1 --dry-run", file=sys.stderr)
        return 2
    report = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)",
              "ceilings": ceilings(device, dry), "results": []}
    print(json.dumps(report["ceilings"]), flush=True)
    shapes = {"tiny": (4, 2, 64, 32)} if dry else MOE_SHAPES
    dtypes = [torch.float32] if dry else [torch.bfloat16, torch.float16]
    for name, shape in shapes.items():
        for tokens in ((1, 16) if dry else TOKENS):
            for dtype in dtypes:
                report["results"].append(moe_case(name, shape, tokens, dtype, device))
                print(json.dumps(report["results"][-1]), flush=True)
            if device.type == "cuda" and torch.cuda.get_device_capability()[0] >= 9:
                report["results"].append(moe_case(name, shape, tokens, torch.bfloat16, device, fp8=True))
                print(json.dumps(report["results"][-1]), flush=True)
            report["results"].append(mxfp4_case(name, shape, tokens, device))
            print(json.dumps(report["results"][-1]), flush=True)
    for batch, tree, cache in ([(2, 8, 40)] if dry else [(1, 16, 2048), (8, 32, 4096), (16, 64, 8192)]):
        report["results"].append(attention_case(batch, tree, cache, device, torch.float32 if dry else torch.bfloat16,
                                                heads=(4, 2) if dry else (32, 4), dim=32 if dry else 128))
        print(json.dumps(report["results"][-1]), flush=True)
    bad = [r for r in report["results"] if r["rel_err"] > 3e-2 or not r.get("route_exact", True)]
    report["ok"] = not bad
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("OK" if not bad else f"FAILED: {len(bad)} cases out of tolerance", flush=True)
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
