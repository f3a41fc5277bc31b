"""python -m specdec.training: train the embedded default MoE target and its draft, and export them.

    python -m specdec.training target [--shape wide] [--tokens 16e6] [--max-minutes M]
    python -m specdec.training draft [--tokens 4e6]       # distilled from runs/target
    python -m specdec.training head [--tokens 4e6]        # an EAGLE-3 head on runs/target's features
    python -m specdec.training features --teacher FILE.gguf --tokens 2e6   # a real target's features, kept
    python -m specdec.training head --teacher FILE.gguf --features runs/features --name head-qwen
    python -m specdec.training features --teacher FILE.gguf --held-out --name features-held-out --tokens 3e4
    python -m specdec.training agreement --teacher FILE.gguf --features runs/features-held-out --name head-qwen
    python -m specdec.training export-head --teacher FILE.gguf --name head-qwen --out DIR
    python -m specdec.training dense-draft --teacher FILE.gguf --features runs/features --name dense-qwen
    python -m specdec.training export-dense-draft --teacher FILE.gguf --name dense-qwen --out DIR
    python -m specdec.training export                     # both into specdec/default_models
    python -m specdec.training pack --tokens 30e6         # packed corpus for a machine without network
    python -m specdec.training target --device cuda --data runs/packed.npz --batch-size 128 --tokens 300e6

Every stage is resumable: rerunning the same command continues from the checkpoint in --runs.
The tokenizer is the shipped one (specdec/default_models/target/tokenizer.json), so the index
and the engine's prompts stay valid across retrains. --init-from starts from a model directory's
weights (e.g. the shipped defaults) on a machine that has no checkpoint.
"""

import argparse
import json
import logging
import sys
from pathlib import Path

import torch

from specdec.models.eagle import Eagle3Config
from specdec.models.loader import load_model, save_model
from specdec.training.corpus import corpus_summary, load_corpus
from specdec.training.eagle3 import (
    DRAFT_VOCAB,
    HEAD_LOGGED,
    TeacherLogits,
    build_head,
    draft_vocabulary,
    head_config,
    head_loss_fn,
    load_head_weights,
    save_head,
)
from specdec.training.packed import PackedBatches, write_packed
from specdec.training.recipe import DEFAULT_SHAPE, TARGET_SHAPES, active_params, draft_config, target_config
from specdec.training.tokenizer import SPECIAL_TOKENS
from specdec.training.train import (
    TrainSettings,
    build_model,
    checkpoint_state,
    cpu_has_bf16,
    has_checkpoint,
    run_model,
    train,
    trained_summary,
)

log = logging.getLogger("specdec.training")
MODELS = Path(__file__).resolve().parents[1] / "default_models"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specdec.training", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=("target", "draft", "head", "features", "export", "pack", "agreement",
                                          "export-head", "dense-draft", "export-dense-draft"))
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="checkpoints, logs, corpus cache")
    parser.add_argument("--out", type=Path, default=MODELS, help="export directory")
    parser.add_argument("--shape", choices=sorted(TARGET_SHAPES), default=DEFAULT_SHAPE)
    parser.add_argument("--name", help="run directory under --runs (default: the stage)")
    parser.add_argument("--tokens", type=float, help="token budget of the whole run")
    parser.add_argument("--max-minutes", type=float, help="stop after this long (resumable)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--data", type=Path, help="a packed corpus (pack stage) instead of the live corpus")
    parser.add_argument("--mix", choices=("default", "copy", "recall", "induct", "settle", "psm"), default="default",
                        help="sample kinds (copy: a third of the samples see an edited earlier revision first; "
                             "recall: a quarter are unrelated lines, then some of them again; "
                             "induct: recall plus repeated runs of random tokens; settle: recall and a few such runs; "
                             "psm: no SPM samples, for a target served in PSM order)")
    parser.add_argument("--init-from", type=Path, help="a model (or, for head, an EAGLE-3 head) directory to start from "
                             "when there is no checkpoint")
    parser.add_argument("--teacher", type=Path, help="the draft's teacher (default: runs/target's checkpoint)")
    parser.add_argument("--features", type=Path, help="head: train on this feature store (made by the features "
                             "stage) instead of running the teacher on every batch")
    parser.add_argument("--draft-vocab", type=int, default=DRAFT_VOCAB,
                        help="head, dense-draft: tokens of its vocabulary")
    parser.add_argument("--init-layers", default="0,-1",
                        help="dense-draft: the target layers it starts as (negative: from the last)")
    parser.add_argument("--rows", type=int, default=16, help="agreement: feature rows measured on")
    parser.add_argument("--bf16", choices=("auto", "on", "off"), default="auto",
                        help="head --features: its products in bfloat16 under autocast, weights and optimizer "
                             "in float32 (auto: where the CPU has AVX512-BF16)")
    parser.add_argument("--held-out", action="store_true",
                        help="features: rows of the held-out packages (what agreement measures a head on)")
    return parser


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.tokens is not None and args.tokens < 1:
        parser.error(f"--tokens must be at least 1 (got {args.tokens:g}); leave it out for the stage's default")
    args.runs.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        handlers=[logging.StreamHandler(sys.stderr), logging.FileHandler(args.runs / "train.log")])
    torch.set_num_threads(args.threads)
    tokenizer = tokenizer_of_defaults()
    special = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    if args.stage == "export":
        return _export_all(args, tokenizer, special)
    if args.stage == "pack":
        maker = _sample_maker(args, tokenizer)
        write_packed(maker, int(args.tokens or 30e6), args.seq_len, args.data or args.runs / "packed.npz")
        return 0
    if args.stage == "features":
        return _extract_features(args)
    if args.stage in ("dense-draft", "export-dense-draft"):
        from specdec.training import dense_stages

        return dense_stages.train_dense_draft(args) if args.stage == "dense-draft" \
            else dense_stages.export_dense_draft(args)
    if args.stage in ("agreement", "export-head"):
        return _measure_head(args) if args.stage == "agreement" else _export_head(args)
    if args.stage == "head" and args.features:
        return _train_head_on_features(args)
    run_dir = args.runs / (args.name or args.stage)
    teacher = _teacher(args, special, tokenizer) if args.stage in ("draft", "head") else None
    if args.stage == "head":
        raw = head_config(teacher.config)
        model = build_head(raw, teacher, args.seed).to(args.device)
        if args.init_from and not has_checkpoint(run_dir):
            _init_head(model, args.init_from, teacher, run_dir)
    else:
        raw = target_config(tokenizer.get_vocab_size(), special, args.shape) if args.stage == "target" \
            else draft_config(tokenizer.get_vocab_size(), special)
        model = _initial_model(raw, args, run_dir)
    default_tokens = 16e6 if args.stage == "target" else 4e6
    distilled = args.stage == "draft"
    settings = TrainSettings(tokens=int(args.tokens or default_tokens), batch_size=args.batch_size,
                             seq_len=args.seq_len, lr=args.lr, seed=args.seed + (args.stage != "target"),
                             kd_weight=0.5 if distilled else 0.0, kd_hard_weight=0.2 if distilled else 0.0,
                             max_minutes=args.max_minutes, device=args.device)
    if args.data:
        source = PackedBatches(args.data, settings.seed)
    else:
        maker = _sample_maker(args, tokenizer, seed=settings.seed)
        source = maker
    if args.stage == "head" and not has_checkpoint(run_dir) and not args.init_from:
        draft_vocabulary(model, (source.batch(i, 8, settings.seq_len) for i in range(200)))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    log.info("%s %s: %.2fM parameters, %d steps of %d tokens", args.stage, run_dir,
             sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6,
             settings.total_steps, settings.batch_size * settings.seq_len)
    loss_fn = head_loss_fn(teacher, args.device) if args.stage == "head" else None
    done = train(model, lambda step: source.batch(step, settings.batch_size, settings.seq_len), settings,
                 run_dir, teacher=teacher if distilled else None, loss_fn=loss_fn,
                 logged=HEAD_LOGGED if args.stage == "head" else "loss")
    log.info("%s: %s", run_dir, "finished" if done else "stopped; rerun the same command to resume")
    return 0


def _extract_features(args) -> int:
    """The teacher's features over the corpus recipe's rows, into runs/NAME (default features)."""
    from specdec.training.features import FeatureSettings, FeatureStore, extract, target_identity

    if not args.teacher:
        raise SystemExit("features: --teacher FILE.gguf (or a model directory) is required")
    teacher = load_model(args.teacher, packed=_packs(args.teacher)).train(False)
    capture = Eagle3Config.from_dict(head_config(teacher.config)).capture_layers(teacher.config.num_layers)
    # The default mix is mostly SPM, the order Qwen is served in (fim_formats.QWEN): the head
    # reads the features of prompts laid out as the ones it will draft for.
    settings = FeatureSettings(target=target_identity(args.teacher), capture=tuple(capture),
                               hidden=teacher.config.hidden_size, seq_len=args.seq_len, seed=args.seed,
                               mix=args.mix + ("+held-out" if args.held_out else ""))
    store = FeatureStore.open(args.runs / (args.name or "features"), settings)
    maker = _sample_maker(args, teacher.tokenizer, held_out=args.held_out)
    rows = int((args.tokens or 2e6) // args.seq_len)
    done = extract(teacher, lambda i: maker.batch(i, 1, args.seq_len)[0], store, rows, args.max_minutes)
    log.info("features: %d rows in %s; %s", store.rows, store.root, "done" if done else "rerun to continue")
    return 0


def _train_head_on_features(args) -> int:
    """An EAGLE-3 head for --teacher trained on a feature store: the teacher is only read for its
    config and embedding."""
    from specdec.training.features import FeatureStoreError, open_store_of

    if not args.teacher:
        raise SystemExit("head --features: --teacher (the features' target) is required")
    try:
        store = open_store_of(args.features, args.teacher)
    except FeatureStoreError as error:
        raise SystemExit(str(error)) from None
    teacher = load_model(args.teacher, packed=_packs(args.teacher)).train(False)
    raw = head_config(teacher.config, draft_vocab=args.draft_vocab)
    run_dir = _head_run(args)
    model = build_head(raw, teacher, args.seed)
    if has_checkpoint(run_dir):  # its draft vocabulary picks the teacher's logits, before train() resumes it
        model.load_state_dict(checkpoint_state(run_dir)["model"])
    elif args.init_from:
        _init_head(model, args.init_from, teacher, run_dir)
    else:
        draft_vocabulary(model, (store.row_ids(i).tolist() for i in range(store.rows)))
    settings = TrainSettings(tokens=int(args.tokens or 4e6), batch_size=args.batch_size,
                             seq_len=store.settings.seq_len, lr=args.lr, seed=args.seed + 1,
                             max_minutes=args.max_minutes, device="cpu",
                             bf16=args.bf16 == "on" or (args.bf16 == "auto" and cpu_has_bf16()))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    log.info("head %s on %s (%d rows): %.2fM trained parameters, %d steps%s", run_dir, store.root, store.rows,
             sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6, settings.total_steps,
             ", products in bfloat16" if settings.bf16 else "")
    done = train(model, lambda step: store.batch(step, settings.batch_size, settings.seed), settings, run_dir,
                 loss_fn=head_loss_fn(None, stored=TeacherLogits(teacher, model)), logged=HEAD_LOGGED)
    log.info("%s: %s", run_dir, "finished" if done else "stopped; rerun the same command to resume")
    return 0


def _packs(path: Path) -> bool:
    """A GGUF teacher runs packed where the native step builds, as it serves."""
    from specdec.models.quantize import loads_packed

    return loads_packed(path, "auto")


def tokenizer_of_defaults():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(MODELS / "target" / "tokenizer.json"))


def _sample_maker(args, tokenizer, seed: int | None = None, held_out: bool = False):
    """The corpus recipe's rows, of the training packages or (held_out) of the held-out ones."""
    # Imported here: a machine that trains from a packed corpus needs neither it nor prefixcache.
    from specdec.training.samples import MIXES, SampleMaker

    train_files, held_out_files = load_corpus(args.runs / "corpus" / "downloads")
    log.info("corpus: train %s, held out %s", corpus_summary(train_files), corpus_summary(held_out_files))
    return SampleMaker(held_out_files if held_out else train_files, tokenizer, seed=args.seed if seed is None else seed,
                       mix=MIXES[args.mix])


def _head_run(args) -> Path:
    """The directory of head run --name (checkpoints, config, and the card it started from)."""
    return args.runs / (args.name or "head")


def _trained_head(args):
    """(the teacher, the head of run --name at its checkpoint, its config) for a features run."""
    if not args.teacher:
        raise SystemExit(f"{args.stage}: --teacher (the head's target) is required")
    run_dir = _head_run(args)
    state = checkpoint_state(run_dir)
    if state is None:
        raise SystemExit(f"{run_dir}: no head checkpoint (train one with the head stage)")
    teacher = load_model(args.teacher, packed=_packs(args.teacher)).train(False)
    raw = json.loads((run_dir / "config.json").read_text())
    head = build_head(raw, teacher)
    head.load_state_dict(state["model"])
    return teacher, head.eval(), raw, state


def _measure_head(args) -> int:
    """The head's first- and second-token agreement with its target on a (held-out) feature store."""
    from specdec.training.eagle3 import store_agreement
    from specdec.training.features import FeatureStore

    if not args.features:
        raise SystemExit("agreement: --features (a store extracted with --held-out) is required")
    teacher, head, _, state = _trained_head(args)
    report = {"head": args.name, "features": str(args.features), **trained_summary(state),
              **store_agreement(head, teacher, FeatureStore.open(args.features), rows=args.rows)}
    print(json.dumps(report, indent=2))
    return 0


HEAD_CARD = "card.json"


def _export_head(args) -> int:
    """The head of run --name in the published layout (bf16), into --out, with its card: the
    target it reads, its training (steps, tokens, minutes) and, given --features (a held-out
    store), its agreement with the target by depth."""
    from specdec.models.adapted import target_fingerprint
    from specdec.training.eagle3 import store_agreement
    from specdec.training.features import FeatureStore, target_identity

    if args.out == MODELS:
        raise SystemExit("export-head: --out DIR is required (the embedded models stay as they are)")
    teacher, head, raw, state = _trained_head(args)
    card = {"kind": "eagle3", "target": target_identity(args.teacher),
            "target_fingerprint": target_fingerprint(args.teacher), "draft_vocab": raw["draft_vocab_size"],
            "run": args.name, **trained_summary(state)}
    card.update(_lineage(_head_run(args), card))
    if args.features:
        card["agreement"] = store_agreement(head, teacher, FeatureStore.open(args.features), rows=args.rows)
        card["agreement"]["features"] = args.features.name
    save_head(head, raw, args.out)
    (args.out / HEAD_CARD).write_text(json.dumps(card, indent=2) + "\n")
    log.info("exported the head of %s (step %d) to %s", args.name, state["step"], args.out)
    return 0


def _initial_model(raw: dict, args, run_dir: Path):
    model = build_model(raw, args.seed).to(args.device)
    if args.init_from and not has_checkpoint(run_dir):
        start = load_model(args.init_from, device=args.device)
        model.load_state_dict(start.state_dict(), strict=False)
        log.info("initialised from %s", args.init_from)
    return model


INIT_CARD = "init_card.json"  # in a run started from an exported head: that head's card


def _init_head(head, path: Path, teacher, run_dir: Path) -> None:
    """A head's weights and draft vocabulary from an exported head directory (see load_head_weights);
    its card is kept in the run, so that the run's own card counts the training it started from."""
    try:
        load_head_weights(head, path)
    except ValueError as e:
        raise SystemExit(f"--init-from {e}") from None
    if (path / HEAD_CARD).is_file():
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / INIT_CARD).write_text((path / HEAD_CARD).read_text(encoding="utf-8"), encoding="utf-8")
    log.info("initialised the head from %s", path)


def _lineage(run_dir: Path, card: dict) -> dict:
    """The card's training in all: its own, plus the head's it started from (init_from, and the totals)."""
    try:
        earlier = json.loads((run_dir / INIT_CARD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    before = earlier.get("total", {"train_tokens": earlier.get("train_tokens", 0),
                                    "train_minutes": earlier.get("train_minutes", 0.0)})
    return {"init_from": earlier,
            "total": {"train_tokens": card["train_tokens"] + before["train_tokens"],
                      "train_minutes": round(card["train_minutes"] + before["train_minutes"], 1)}}


def _teacher(args, special: dict, tokenizer):
    if args.teacher:
        return load_model(args.teacher, device=args.device).train(False)
    return run_model(args.runs / "target")[0].to(args.device)


def _export_all(args, tokenizer, special: dict) -> int:
    report, models = {}, {}
    for name in ("target", "draft"):
        model, raw, state = run_model(args.runs / name)
        models[name] = model
        export_model(model, raw, tokenizer, args.out / name)
        log.info("exported %s (step %d, %.1f min) to %s", name, state["step"], state["elapsed"] / 60, args.out / name)
        report[name] = {"total_params": sum(p.numel() for p in model.parameters()),
                        "active_params": active_params(model.config), **trained_summary(state)}
    head_state = checkpoint_state(args.runs / "head")
    if head_state is not None:
        raw = json.loads((args.runs / "head" / "config.json").read_text())
        head = build_head(raw, models["target"])
        head.load_state_dict(head_state["model"])
        save_head(head, raw, args.out / "head")
        report["head"] = {"trained_params": sum(p.numel() for p in head.parameters() if p.requires_grad),
                          **trained_summary(head_state)}
        log.info("exported the EAGLE-3 head (step %d) to %s", head_state["step"], args.out / "head")
    (args.out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


def export_model(model, raw: dict, tokenizer, out: Path) -> None:
    """HF layout, weights stored in bf16 to keep the package small."""
    out.mkdir(parents=True, exist_ok=True)
    stored = build_model(raw, 0).to(torch.bfloat16)
    stored.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    save_model(stored, out, raw)
    tokenizer.save(str(out / "tokenizer.json"))
    generation = {"eos_token_id": raw["eos_token_id"], "pad_token_id": raw.get("pad_token_id", raw["eos_token_id"]),
                  "do_sample": False, "max_new_tokens": 64}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "additional_special_tokens": SPECIAL_TOKENS[1:], "model_max_length": raw["max_position_embeddings"],
    }, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
