"""Host memory a model load needs: the peak of anonymous memory while `load_model` reads a
sharded checkpoint, against the weights' size in the load dtype, and the same for transformers.

    python bench/load_memory.py [--params 100e6] [--shard-mb 100] [--out FILE]

A random Qwen3-MoE checkpoint of about --params parameters is written in fp32 shards by
transformers (offline), then each load runs in a fresh process that samples its own RssAnon
every 2 ms, with glibc's mmap threshold fixed. File-backed pages (safetensors' mmap) are not counted: the kernel can drop them at
will, while anonymous memory is what the loader holds. A loader that kept a full host copy
before moving weights would peak at twice the weights; one that converts tensor by tensor
peaks at the weights plus its largest transient (one layer's stacked experts). `held_mb` also
counts what a process's first load imports (tens of MB, the same for every size).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, threading, time
import torch

def anon_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])

path, dtype, loader = sys.argv[1], getattr(torch, sys.argv[2]), sys.argv[3]
if loader == "ours":
    from specdec import load_model
    load = lambda: load_model(path, dtype=dtype)
else:
    from transformers import AutoModelForCausalLM
    load = lambda: AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
base, peak, done = anon_kb(), [0], threading.Event()

def sample():
    while not done.is_set():
        peak[0] = max(peak[0], anon_kb())
        time.sleep(0.002)

thread = threading.Thread(target=sample)
thread.start()
start = time.perf_counter()
model = load()
seconds = time.perf_counter() - start
done.set()
thread.join()
held = anon_kb()
weights = sum(p.numel() * p.element_size() for p in model.state_dict().values())
print(json.dumps({"peak_mb": (max(peak[0], held) - base) / 1024, "held_mb": (held - base) / 1024,
                  "seconds": seconds, "weights_mb": weights / 2**20}))
"""


def write_checkpoint(directory: Path, params: float, shard_mb: int) -> int:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    hidden, layers, experts = 512, 4, 16
    per_expert = 3 * hidden * hidden  # gate, up, down at moe_intermediate_size = hidden
    layers = max(1, round(params / (experts * per_expert)))
    config = Qwen3MoeConfig(vocab_size=8192, hidden_size=hidden, intermediate_size=hidden, moe_intermediate_size=hidden,
                            num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                            num_experts=experts, num_experts_per_tok=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config)
    model.save_pretrained(directory, max_shard_size=f"{shard_mb}MB")
    return sum(p.numel() for p in model.parameters())


def measure(path: Path, dtype: str, loader: str) -> dict:
    # A fixed mmap threshold: freed large blocks go back to the system at once, so RssAnon is
    # what the loader holds, not what glibc's heap kept after earlier frees.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), dtype, loader], capture_output=True, text=True,
                         check=False, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{loader} load failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=100e6)
    parser.add_argument("--shard-mb", type=int, default=100)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model"
        count = write_checkpoint(path, args.params, args.shard_mb)
        shards = len(list(path.glob("*.safetensors")))
        report = {"parameters": count, "shards": shards, "loads": {}}
        for loader in ("ours", "transformers"):
            for dtype in ("float32", "bfloat16"):
                figures = measure(path, dtype, loader)
                figures["peak_over_weights"] = figures["peak_mb"] / figures["weights_mb"]
                figures["transient_mb"] = figures["peak_mb"] - figures["held_mb"]
                report["loads"][f"{loader} {dtype}"] = figures
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
