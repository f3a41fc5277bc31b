"""Launch configurations for the fused-MoE kernels, read from data files keyed by problem and device.

Files: kernels/configs/<device>.json, e.g. "NVIDIA_H200.json", with entries
  "E=128,N=768,K=2048,dtype=bfloat16": {"1": {...}, "16": {...}, "256": {...}}
mapping a token count to {BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages}; the nearest token
count at or above the batch is used. Missing devices fall back to the architecture's defaults
(sm_90.json for Hopper, sm_100.json for Blackwell), then to a generic config. bench/tune_moe.py
writes these files.
"""

import json
from functools import lru_cache
from pathlib import Path

import torch

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
GENERIC = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}
# The interpreter (CPU tensors) runs each program in numpy: few big tiles are much faster there.
INTERPRETER = {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2}


def problem_key(num_experts: int, n: int, k: int, dtype) -> str:
    return f"E={num_experts},N={n},K={k},dtype={str(dtype).replace('torch.', '')}"


def device_files(device) -> list[str]:
    if device.type != "cuda":
        return []
    name = torch.cuda.get_device_name(device).replace(" ", "_")
    major, minor = torch.cuda.get_device_capability(device)
    return [name, f"sm_{major}{minor}", f"sm_{major}0"]


@lru_cache(maxsize=64)
def _read(name: str) -> dict:
    path = CONFIG_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def launch_config(num_experts: int, n: int, k: int, dtype, device, num_tokens: int) -> dict:
    if device.type == "cpu":
        return dict(INTERPRETER)
    key = problem_key(num_experts, n, k, dtype)
    for name in device_files(device):
        table = _read(name)
        by_tokens = table.get(key) or table.get("default")
        if by_tokens:
            sizes = sorted(int(t) for t in by_tokens)
            chosen = next((t for t in sizes if t >= num_tokens), sizes[-1])
            return dict(GENERIC, **by_tokens[str(chosen)])
    return dict(GENERIC)
