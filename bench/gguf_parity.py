"""A GGUF file through our loader against transformers' own GGUF loader: token ids on source files,
and logits on prompts.

    python bench/gguf_parity.py [--gguf FILE] [--files 500] [--prompts 5] [--out bench/results/gguf_parity.json]

FILE defaults to the pulled default model. Token ids are compared on the first --files Python
files of the standard library (sorted paths); logits on --prompts code windows of 256 tokens,
as the largest relative difference max|ours - theirs| / max|theirs| per prompt.
"""

import argparse
import json
import sys
import sysconfig
import time
from pathlib import Path

import torch

from specdec import load_model

# The repository root, after site-packages: bench/ is not installed.
sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench.pulled import target_or_default  # noqa: E402

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def source_files(count: int) -> list[Path]:
    files = sorted(p for p in STDLIB.rglob("*.py") if "site-packages" not in p.parts)
    return files[:count]


def token_agreement(ours, theirs, files: list[Path]) -> dict:
    differing = []
    for file in files:
        text = file.read_text(encoding="utf-8", errors="replace")
        if ours.encode(text).ids != theirs.encode(text, add_special_tokens=False):
            differing.append(str(file.relative_to(STDLIB)))
    return {"files": len(files), "identical": len(files) - len(differing), "differing": differing[:20]}


def logits_difference(ours, theirs, tokenizer, files: list[Path], prompts: int) -> list[float]:
    out = []
    for file in files[:prompts]:
        ids = tokenizer.encode(file.read_text(encoding="utf-8", errors="replace")).ids[:256]
        batch = torch.tensor([ids])
        with torch.no_grad():
            mine, reference = ours.logits(batch), theirs(batch).logits.float()
        out.append(float((mine - reference).abs().max() / reference.abs().max()))
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", type=Path)
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    path = target_or_default(args.gguf, "--gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    ours = load_model(path)
    loaded_ours = time.perf_counter() - started
    theirs_tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    files = source_files(args.files)
    result = {"gguf": str(path), "load_seconds_ours": round(loaded_ours, 1),
              "tokens": token_agreement(ours.tokenizer, theirs_tokenizer, files)}
    print(json.dumps(result["tokens"]), file=sys.stderr, flush=True)
    theirs = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    result["logits_max_relative_difference"] = logits_difference(ours, theirs, ours.tokenizer, files, args.prompts)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
