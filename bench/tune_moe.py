"""Tune the fused-MoE launch configuration on this GPU and write kernels/configs/<device>.json.

    python bench/tune_moe.py --experts 128 --top-k 8 --hidden 2048 --inter 768 --dtype bfloat16
"""

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

# After site-packages: the repository's folders (kernels/, server/, eval/) must not shadow installed packages.
sys.path.append(str(Path(__file__).resolve().parents[1]))

import specdec_kernels.configs as configs  # noqa: E402
from bench.gpu_kernels import timed  # noqa: E402
from specdec_kernels.moe_torch import moe_route_torch  # noqa: E402
from specdec_kernels.triton_moe import fused_moe_triton  # noqa: E402

SPACE = {"BLOCK_M": (16, 32, 64, 128), "BLOCK_N": (32, 64, 128, 256), "BLOCK_K": (32, 64, 128),
         "num_warps": (4, 8), "num_stages": (2, 3, 4)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--experts", type=int, required=True)
    p.add_argument("--top-k", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--inter", type=int, required=True)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256,1024,4096")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("tune_moe needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype, device = getattr(torch, args.dtype), torch.device("cuda")
    name = torch.cuda.get_device_name().replace(" ", "_")
    key = configs.problem_key(args.experts, args.inter, args.hidden, dtype)
    best = {}
    w1 = torch.randn(args.experts, 2 * args.inter, args.hidden, device=device, dtype=dtype) / args.hidden**0.5
    w2 = torch.randn(args.experts, args.hidden, args.inter, device=device, dtype=dtype) / args.inter**0.5
    for tokens in (int(t) for t in args.tokens.split(",")):
        x = torch.randn(tokens, args.hidden, device=device, dtype=dtype)
        weights, ids = moe_route_torch(torch.randn(tokens, args.experts, device=device), args.top_k, True)
        results = []
        for values in itertools.product(*SPACE.values()):
            cfg = dict(zip(SPACE, values, strict=True))
            configs.launch_config = lambda *a, cfg=cfg, **k: dict(cfg)
            import specdec_kernels.triton_moe as tm

            tm.launch_config = configs.launch_config
            try:
                run = lambda x=x, weights=weights, ids=ids: fused_moe_triton(x, w1, w2, weights, ids)  # noqa: E731
                results.append((timed(run, device, 10), cfg))
            except Exception:  # a config that does not fit (shared memory, registers) is skipped
                continue
        ms, cfg = min(results, key=lambda r: r[0])
        best[str(tokens)] = cfg
        print(f"tokens {tokens}: {ms:.3f} ms {cfg}", flush=True)
    path = configs.CONFIG_DIR / f"{name}.json"
    table = json.loads(path.read_text()) if path.exists() else {}
    table[key] = best
    path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
