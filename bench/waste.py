"""Tokens generated past the point where a completion's stop was decided.

    python bench/waste.py --repo DIR [--target FILE.gguf] [--points 50] [--strategies ar,hybrid]
                          [--seed 0] [--out bench/results/waste.json]

At each of eval's points of the repository (mid-line and line-start cursors, as editors ask), the
engine completes with each strategy. The generated tokens are then replayed one fewer at a time:
the waste is how many of the last ones could have been left ungenerated with the stop already
decided on the shorter text (the same stop rules, the same healed prompt). A completion that ends
at its token limit or at the model's end of text has none by definition. With a real model each
wasted token is a decode step, about 25 ms on a laptop CPU.
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))

from specdec import Engine, load_model  # noqa: E402
from specdec.decode.stops import rules_for  # noqa: E402
from specdec.models.model_cache import installed_path, registry  # noqa: E402
from specdec.models.quantize import loads_packed  # noqa: E402
from specdec_eval.points import sample_points  # noqa: E402

DECIDED = ("newline", "dedent", "suffix", "repeat", "word")  # stops the text decides, not a limit


def waste(engine: Engine, prefix: str, suffix: str, mode: str, result) -> int:
    """Generated tokens past the first of them after which the result's stop was already decided."""
    if result.stats.stop_reason not in DECIDED:
        return 0
    healed = len(engine.prompt_for(prefix, suffix).healed_text)
    rules = rules_for(prefix, suffix, mode)
    tokens = result.tokens
    needed = len(tokens)
    while needed > 0 and rules.cut(engine.tokenizer.decode(tokens[: needed - 1])[healed:]).position is not None:
        needed -= 1
    return len(tokens) - needed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--target", type=Path, help="a GGUF file (default: the pulled default model)")
    parser.add_argument("--points", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategies", default="ar,hybrid")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    target = args.target or installed_path(registry()[0])
    if target is None:
        parser.error("no --target, and the default model is not pulled (specdec models pull)")
    engine = Engine(load_model(target, packed=loads_packed(target, "auto")), None, None)
    report = {"command": " ".join(sys.argv), "points": args.points, "strategies": {}}
    for strategy in args.strategies.split(","):
        wasted, by_reason, started = [], {}, time.perf_counter()
        for point in sample_points(args.repo, args.points, args.seed):
            result = engine.complete(point.prefix, point.suffix, strategy=strategy, mode=point.mode,
                                     max_tokens=args.max_tokens, path=point.path)
            wasted.append(waste(engine, point.prefix, point.suffix, point.mode, result))
            reason = result.stats.stop_reason
            by_reason[reason] = by_reason.get(reason, 0) + 1
        report["strategies"][strategy] = {"tokens_wasted": sum(wasted), "completions_with_waste": sum(w > 0 for w in wasted),
                                          "stop_reasons": by_reason, "seconds": round(time.perf_counter() - started, 1)}
        print(strategy, json.dumps(report["strategies"][strategy]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
