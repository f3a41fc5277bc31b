"""What int8 weights cost in quality: bits per character through the serving forward, fp32
against int8, on the held-out packages' files (the training recipe's split), and how often the
two agree on the next token.

    python bench/int8_quality.py [--models DIR] [--runs runs] [--files 40] [--out FILE]

Needs the corpus cache the training recipe downloads (runs/corpus/downloads). Each file's first
1,024 tokens, from its start, no header, as specdec.training.evaluate measures bits per char.
"""

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec import default_model_dir, load_model
from specdec.models.quantize import quantize_int8
from specdec.training.corpus import load_corpus
from specdec.training.evaluate import by_hash

SEQ_LEN = 1024


@torch.inference_mode()
def measure(models: dict, files) -> dict:
    tokenizer = next(iter(models.values())).tokenizer
    nats = dict.fromkeys(models, 0.0)
    agree = positions = chars = 0
    for f in files:
        ids = tokenizer.encode(f.text).ids[: SEQ_LEN + 1]
        if len(ids) < 2:
            continue
        chunk = torch.tensor(ids)
        argmaxes = []
        for name, model in models.items():
            logits = model.logits(chunk[None, :-1])[0]
            nats[name] += F.cross_entropy(logits, chunk[1:], reduction="sum").item()
            argmaxes.append(logits.argmax(-1))
        agree += int((argmaxes[0] == argmaxes[-1]).sum())
        positions += len(ids) - 1
        chars += len(tokenizer.decode(ids[1:]))
    bpc = {name: round(n / math.log(2) / chars, 4) for name, n in nats.items()}
    return {"files": len(files), "tokens": positions, "chars": chars, "bits_per_char": bpc,
            "bpc_change": round(bpc["int8"] - bpc["fp32"], 4), "next_token_agreement": round(agree / positions, 4)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=Path, default=default_model_dir())
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    downloads = args.runs / "corpus" / "downloads"
    if not downloads.is_dir():
        raise SystemExit(f"{downloads}: no corpus cache (the training recipe, python -m specdec.training target, downloads it)")
    _, held_out = load_corpus(downloads)
    models = {"fp32": load_model(args.models / "target"), "int8": quantize_int8(load_model(args.models / "target"))}
    report = measure(models, by_hash(held_out)[: args.files])
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
