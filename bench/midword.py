"""Completions at a cursor inside a word, against the plain FIM prompt with no healing.

    python bench/midword.py --repo REPO [--points 50] [--seed 0] [--target FILE] [--quantize int8] [--out FILE.json]

Each point is a random identifier of 6 or more characters in a random Python file of REPO, cut
after 3 or more of its characters, with nothing after the cursor on its line (the user is typing
the word). The engine (strategy ar, greedy) answers it; the same model also answers the plain
prompt `<|fim_prefix|>P<|fim_suffix|>S<|fim_middle|>` greedily with no healing, no context and no
stop rules but end of text (what transformers does with that prompt). Reported: how often each is
empty on the cursor's line, how often the engine is empty where the plain prompt is not, and how
often each first line completes the word and line exactly as the file has it.
"""

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

import torch

from specdec import Engine, Segment, load_model
from specdec.models.quantize import loads_packed, quantize_target

# The repository root, after site-packages: bench/ is not installed.
sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench.pulled import target_or_default  # noqa: E402

WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{5,}")
PREFIX_CHARS, SUFFIX_CHARS, MAX_TOKENS = 1500, 400, 24


def sample_points(repo: Path, count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    files = sorted(p for p in repo.rglob("*.py") if p.stat().st_size > 500)
    points = []
    while len(points) < count:
        file = rng.choice(files)
        lines = file.read_text(encoding="utf-8", errors="replace").split("\n")
        row = rng.randrange(len(lines))
        words = list(WORD.finditer(lines[row]))
        if not words:
            continue
        word = rng.choice(words)
        cut = word.start() + rng.randrange(3, len(word.group()) - 1)
        before = "\n".join(lines[:row] + [lines[row][:cut]])
        after = "\n" + "\n".join(lines[row + 1 :])
        points.append({"file": str(file.relative_to(repo)), "line": row + 1, "prefix": before[-PREFIX_CHARS:],
                       "suffix": after[:SUFFIX_CHARS], "expected": lines[row][cut:]})
    return points


def plain_completion(model, prefix: str, suffix: str) -> str:
    """Greedy tokens of the plain prompt (one prefill, then one cached step a token) until end of
    text or the end of the cursor's line."""
    tokenizer, stops = model.tokenizer, set(model.config.eos_token_ids)
    stops |= {tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>")}
    ids = tokenizer.encode(f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>").ids
    cache = model.new_cache(len(ids) + MAX_TOKENS + 1)
    new, out = torch.tensor(ids), []
    for _ in range(MAX_TOKENS):
        start = cache.length
        logits = model(new, torch.arange(start, start + len(new)), [Segment(cache, len(new))],
                       logits_rows=torch.tensor([len(new) - 1]))
        cache.keep_all()
        token = int(logits[-1].argmax())
        if token in stops:
            break
        out.append(token)
        if "\n" in tokenizer.decode(out):
            break
        new = torch.tensor([token])
    return tokenizer.decode(out)


def first_line(text: str) -> str:
    return text.split("\n", 1)[0]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--points", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=Path)
    parser.add_argument("--quantize", default="none", help="the target's weights as `specdec serve --quantize` takes them")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    target = target_or_default(args.target)
    model = quantize_target(load_model(target, packed=loads_packed(target, args.quantize)), args.quantize)
    engine = Engine(model, None, None, warm_up=False)
    rows = []
    for number, point in enumerate(sample_points(args.repo, args.points, args.seed), 1):
        started = time.perf_counter()
        ours = first_line(engine.complete(point["prefix"], point["suffix"], max_tokens=MAX_TOKENS, strategy="ar").text)
        plain = first_line(plain_completion(model, point["prefix"], point["suffix"]))
        rows.append({**{k: point[k] for k in ("file", "line", "expected")}, "ours": ours, "plain": plain})
        print(f"{number:3d} {time.perf_counter() - started:5.1f}s {point['prefix'][-20:]!r} -> ours {ours!r} "
              f"plain {plain!r} file {point['expected']!r}", file=sys.stderr, flush=True)
    summary = {
        "points": len(rows), "target": str(target), "quantize": args.quantize, "repo": str(args.repo), "seed": args.seed,
        "ours_empty": sum(not r["ours"].strip() for r in rows),
        "plain_empty": sum(not r["plain"].strip() for r in rows),
        "ours_empty_where_plain_is_not": sum(not r["ours"].strip() and bool(r["plain"].strip()) for r in rows),
        "ours_exact_line": sum(r["ours"].strip() == r["expected"].strip() for r in rows),
        "plain_exact_line": sum(r["plain"].strip() == r["expected"].strip() for r in rows),
    }
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "points": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
