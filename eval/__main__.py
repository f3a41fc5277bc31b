"""python -m specdec_eval run --repo REPO --points N --seed S --strategies ar,draft,ngram,trie,hybrid --out DIR
python -m specdec_eval compare A/results.json B/results.json"""

import argparse
import gc
import json
import os
import platform
import shlex
import sys
from pathlib import Path

# `python -m` puts the working directory first on sys.path. From the repository's root its folders
# kernels/, server/ and eval/ would shadow installed packages of those names (the baselines'
# transformers imports Hugging Face's `kernels`); ours are installed as specdec_*.
if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0] or ".") == os.getcwd():
    sys.path.pop(0)

from specdec import QUANTIZATIONS
from specdec_eval.points import sample_points
from specdec_eval.report import write_markdown, write_plots
from specdec_eval.runner import expert_load_summary, run_points, summarize


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec_eval")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="evaluate strategies on random completion points of a repository")
    r.add_argument("--repo", type=Path, required=True)
    r.add_argument("--points", type=int, default=200)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--strategies", default="ar,draft,ngram,trie,hybrid")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--mode", choices=("single", "multi", "auto"), default="auto")
    r.add_argument("--max-tokens", type=int, default=64)
    r.add_argument("--target", type=Path)
    r.add_argument("--draft", type=Path, help="as `specdec serve --draft` takes it (default: the same choice; none: "
                                              "no draft, where a pulled target's exported head would draft)")
    r.add_argument("--quantize", choices=QUANTIZATIONS, default="auto",
                   help="the target's weights as `specdec serve --quantize` takes them (default auto, as served: "
                        "a GGUF target packed in 8-bit blocks)")
    r.add_argument("--drafts", default="", metavar="LABEL=DIR,...",
                   help="other drafts for the same target: their draft and hybrid run as draft+LABEL, hybrid+LABEL")
    r.add_argument("--held-out-of", type=Path, metavar="DRAFT_DIR",
                   help="sample points only from the files an adapted draft held out (its adapt.json)")
    r.add_argument("--baselines", action="store_true", help="also time transformers' generate, prompt lookup and assisted decoding")
    r.add_argument("--always-speculate", action="store_true",
                   help="speculate at every step with every node the sources offer (up to the tree budget), even where "
                        "measured plain steps are faster: acceptance of the sources themselves, apart from the hardware")
    r.add_argument("--context", default="auto",
                   help="auto,none: every strategy with and without retrieved repository context, side by side")
    r.add_argument("--context-tokens", type=int, metavar="N",
                   help="prompt tokens for retrieved repository code under --context auto (default: the engine's)")
    r.add_argument("--typing-along", action="store_true",
                   help="time the follow-up request after the user types the first 3 characters of each suggestion")
    c = sub.add_parser("compare", help="print the differences between two results.json files")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    try:
        return _run(args, argv) if args.command == "run" else _compare(args)
    except (OSError, ValueError, KeyError) as err:
        print(f"eval: error: {err}", file=sys.stderr)
        return 2


def _run(args, argv) -> int:
    import torch

    from prefixcache import Index
    from specdec import PLAIN, ContextSettings, Engine, default_model_dir
    from specdec.engine import asks_no_draft

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    contexts = tuple(c.strip() for c in args.context.split(",") if c.strip())
    if not contexts or any(c not in ("auto", "none") for c in contexts):
        raise ValueError(f"--context {args.context!r}: expected auto, none or both (auto,none)")
    if PLAIN not in strategies:
        strategies.insert(0, PLAIN)
    if not args.repo.is_dir():
        raise ValueError(f"{args.repo}: not a directory")
    points = sample_points(args.repo, args.points, args.seed, args.mode, files=_held_out(args))
    if not points:
        raise ValueError(f"{args.repo}: no source files to sample completion points from")
    index = Index.build(args.repo)
    engine = Engine.from_pretrained(args.target, args.draft, index, adaptive=not args.always_speculate,
                                    quantize=args.quantize)
    if args.context_tokens is not None:
        engine.set_context(ContextSettings(tokens=args.context_tokens))
    baselines = None
    if args.baselines:
        from specdec_eval.baselines import HFBaselines

        if args.draft is None:
            draft = default_model_dir() / "draft" if args.target is None else None
        else:
            draft = None if asks_no_draft(args.draft) else args.draft
        baselines = HFBaselines(args.target or default_model_dir() / "target", draft)
    drafts = {label: _same_costs(Engine.from_pretrained(args.target, path, index, adaptive=engine.adaptive,
                                                        warm_up=False, quantize=args.quantize), engine)
              for label, path in _drafts(args.drafts).items()}
    # What is loaded lives as long as the run: frozen, a full garbage collection no longer scans
    # it (a pause that would land inside whichever point was being timed).
    gc.collect()
    gc.freeze()
    records = run_points(engine, index, points, strategies, args.max_tokens, args.seed, baselines=baselines,
                         typing_along=args.typing_along, contexts=contexts, drafts=drafts)
    gc.unfreeze()
    results = {"repo": args.repo.resolve().name, "points": len(points), "seed": args.seed,
               "target": _model_label(engine.target), "draft": _model_label(engine.draft or engine.head),
               "drafts": {label: _model_label(e.draft or e.head) for label, e in drafts.items()},
               "machine": f"{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}",
               "adaptive": engine.adaptive, "typing_along": args.typing_along,
               "quantize": getattr(engine.target, "quantization", "none"),
               "context_tokens": engine.contexts.settings.tokens,
               "strategies": summarize(records), "expert_load": expert_load_summary(engine)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "points.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items()}) + "\n"
                                                   for rows in records.values() for r in rows))
    command = "python -m specdec_eval " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    write_markdown(results, args.out, command)
    write_plots(results, records, args.out)
    print((args.out / "report.md").read_text())
    return 0


def _drafts(spec: str) -> dict[str, Path]:
    drafts = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        label, _, path = item.partition("=")
        if not label.isidentifier() or not path:
            raise ValueError(f"--drafts {item!r}: expected LABEL=DIR")
        drafts[label] = Path(path)
    return drafts


def _same_costs(other, engine):
    """Another draft of the same shape is priced as the engine's own: the measured verify cost and
    draft-token floor come from one measurement, so that only the weights differ between them."""
    same_shape = other.draft is not None and engine.draft is not None and \
        other.draft.config.raw.get("hidden_size") == engine.draft.config.raw.get("hidden_size") and \
        other.draft.config.num_layers == engine.draft.config.num_layers
    if same_shape:
        other.verify_cost, other.draft_min_prob = engine.verify_cost, engine.draft_min_prob
    other.warm_up()
    return other


def _held_out(args) -> list[str] | None:
    """Repository-relative paths held out by an adapted draft (its card), or None for all files."""
    if args.held_out_of is None:
        return None
    card = json.loads((args.held_out_of / "adapt.json").read_text())
    files = [p for p in card["held_out_files"] if (args.repo / p).is_file()]
    if not files:
        raise ValueError(f"{args.held_out_of}: none of its held-out files is in {args.repo}")
    return files


def _compare(args) -> int:
    a, b = (json.loads(p.read_text()) for p in (args.a, args.b))
    keys = ("tau", "speedup_vs_ar", "tokens_per_s", "exact_match", "edit_similarity", "identical_to_ar")
    print(f"{'strategy':10} {'metric':16} {'A':>10} {'B':>10} {'B-A':>10}")
    for name in sorted(set(a["strategies"]) | set(b["strategies"])):
        sa, sb = a["strategies"].get(name), b["strategies"].get(name)
        if sa is None or sb is None:
            print(f"{name:10} only in {'A' if sb is None else 'B'}")
            continue
        for key in keys:
            print(f"{name:10} {key:16} {sa[key]:10.3f} {sb[key]:10.3f} {sb[key] - sa[key]:+10.3f}")
        for q in ("p50", "p95"):
            va, vb = sa["latency_ms"][q], sb["latency_ms"][q]
            print(f"{name:10} {'latency ' + q:16} {va:10.1f} {vb:10.1f} {vb - va:+10.1f}")
    return 0


def _model_label(model) -> str | None:
    from specdec import model_label

    return None if model is None else model_label(model.path)


if __name__ == "__main__":
    sys.exit(main())
