"""What packing a GGUF model in 8-bit blocks costs: greedy completions of the packed model
against the same file dequantized to fp32, at points of held-out code.

    python bench/packed_quality.py --target FILE.gguf [--points 50] [--tokens 16] [--runs runs]
                                   [--out bench/results/packed_quality.json]

Each point is a line start in a held-out package (specdec.training.corpus.HELD_OUT), drawn with a
fixed seed; the prompt is up to 1,000 tokens of the file before it. Both models decode greedily
from the same prompt; a completion counts as equal when every token is. Bits per character of
both models come from `python -m specdec.training.evaluate --target FILE [--packed]`.
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

from specdec import Segment, load_model  # noqa: E402
from specdec.training.corpus import load_corpus  # noqa: E402
from specdec.training.evaluate import by_hash  # noqa: E402

PROMPT_TOKENS = 1000


def points(files, tokenizer, count: int, seed: int) -> list[list[int]]:
    """Prompts: the tokens before a random non-blank line start, at least 64 of them."""
    rng, out = random.Random(seed), []
    candidates = [f for f in by_hash(files) if len(f.text) > 2000]
    while len(out) < count:
        text = rng.choice(candidates).text
        starts = [i + 1 for i, c in enumerate(text) if c == "\n" and text[i + 1:i + 2].strip()]
        ids = tokenizer.encode(text[:rng.choice(starts)]).ids[-PROMPT_TOKENS:]
        if len(ids) >= 64:
            out.append(ids)
    return out


@torch.inference_mode()
def greedy(model, prompt: list[int], tokens: int) -> list[int]:
    cache = model.new_cache(len(prompt) + tokens + 1)
    logits = model(torch.tensor(prompt), torch.arange(len(prompt)), [Segment(cache, len(prompt))], [len(prompt) - 1])
    cache.keep_all()
    out = [int(logits[-1].argmax())]
    while len(out) < tokens:
        logits = model(torch.tensor(out[-1:]), torch.tensor([cache.length]), [Segment(cache, 1)])
        cache.keep_all()
        out.append(int(logits[-1].argmax()))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--points", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="where the corpus cache is")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    _, held_out = load_corpus(args.runs / "corpus" / "downloads")
    reference, packed = load_model(args.target), load_model(args.target, packed=True)
    prompts = points(held_out, packed.tokenizer, args.points, args.seed)
    equal, first_diff, seconds = 0, [], {"fp32": 0.0, "packed": 0.0}
    for prompt in prompts:
        started = time.perf_counter()
        expected = greedy(reference, prompt, args.tokens)
        seconds["fp32"] += time.perf_counter() - started
        started = time.perf_counter()
        got = greedy(packed, prompt, args.tokens)
        seconds["packed"] += time.perf_counter() - started
        equal += got == expected
        first_diff.append(next((i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b), None))
    report = {"target": str(args.target), "points": len(prompts), "tokens": args.tokens,
              "equal_completions": equal, "equal_share": round(equal / len(prompts), 3),
              "first_differing_token": [d for d in first_diff if d is not None],
              "seconds": {k: round(v, 1) for k, v in seconds.items()}, "threads": torch.get_num_threads()}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
