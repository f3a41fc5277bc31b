"""The dense-draft stages of python -m specdec.training:

    python -m specdec.training dense-draft --teacher FILE.gguf --features runs/features --name dense-qwen \
        [--draft-vocab 8192] [--init-layers 0,-1] [--tokens 1e6] [--max-minutes M]
    python -m specdec.training export-dense-draft --teacher FILE.gguf --name dense-qwen --out DIR \
        [--features runs/features-held-out --rows 16]

Training reads a feature store made by the features stage (its token ids and the target's
last-layer outputs) and resumes from its run's checkpoint as every stage does.
"""

import json
import logging
from pathlib import Path

from specdec.models.adapted import target_fingerprint
from specdec.models.loader import load_model
from specdec.models.quantize import loads_packed
from specdec.training.dense_draft import (
    build_dense_draft,
    dense_agreement,
    dense_draft_config,
    dense_loss_fn,
    save_dense_draft,
)
from specdec.training.eagle3 import TeacherLogits, frequent_tokens_d2t
from specdec.training.features import FeatureStore, FeatureStoreError, open_store_of, target_identity
from specdec.training.train import TrainSettings, checkpoint_state, has_checkpoint, train, trained_summary

log = logging.getLogger("specdec.training")
CARD = "card.json"


def init_layers(text: str) -> tuple:
    """--init-layers "0,-1" -> (0, -1)."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise SystemExit(f"--init-layers wants target layer numbers separated by commas, got {text!r}") from None


def train_dense_draft(args) -> int:
    """A dense draft for --teacher, distilled on the feature store --features."""
    teacher, store = _teacher_and_store(args)
    run_dir = args.runs / (args.name or "dense-draft")
    if has_checkpoint(run_dir):
        raw = json.loads((run_dir / "config.json").read_text())
        draft = build_dense_draft(raw, teacher, _checkpoint_d2t(run_dir))
    else:
        raw = dense_draft_config(teacher.config, args.draft_vocab, init_layers(args.init_layers))
        d2t = frequent_tokens_d2t((store.row_ids(i) for i in range(store.rows)), teacher.config.vocab_size,
                                  args.draft_vocab)
        draft = build_dense_draft(raw, teacher, d2t)
    settings = TrainSettings(tokens=int(args.tokens or 1e6), batch_size=args.batch_size,
                             seq_len=store.settings.seq_len, lr=args.lr, seed=args.seed + 1, warmup_steps=10,
                             max_minutes=args.max_minutes, device="cpu")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    log.info("dense draft %s on %s (%d rows): layers %s of the target, %.2fM trained parameters, %d steps",
             run_dir, store.root, store.rows, raw["init_layers"],
             sum(p.numel() for p in draft.parameters() if p.requires_grad) / 1e6, settings.total_steps)
    done = train(draft, lambda step: store.batch(step, settings.batch_size, settings.seed), settings, run_dir,
                 loss_fn=dense_loss_fn(TeacherLogits(teacher, draft)), logged="agreement")
    log.info("%s: %s", run_dir, "finished" if done else "stopped; rerun the same command to resume")
    return 0


def export_dense_draft(args) -> int:
    """The dense draft of run --name into --out (bf16), with its card (target, training, and with
    --features its agreement with the target on those rows)."""
    if not args.teacher or args.out is None or args.out.name == "default_models":
        raise SystemExit("export-dense-draft: --teacher FILE.gguf and --out DIR are required")
    run_dir = args.runs / (args.name or "dense-draft")
    state = checkpoint_state(run_dir)
    if state is None:
        raise SystemExit(f"{run_dir}: no dense-draft checkpoint (train one with the dense-draft stage)")
    teacher = load_model(args.teacher, packed=loads_packed(args.teacher, "auto")).train(False)
    raw = json.loads((run_dir / "config.json").read_text())
    draft = build_dense_draft(raw, teacher, state["model"]["d2t"])
    draft.load_state_dict(state["model"])
    card = {"kind": "dense-draft", "target": target_identity(args.teacher),
            "target_fingerprint": target_fingerprint(args.teacher), "draft_vocab": raw["draft_vocab_size"],
            "init_layers": raw["init_layers"], "run": args.name, **trained_summary(state)}
    if args.features:
        card["agreement"] = {**dense_agreement(draft.eval(), teacher, FeatureStore.open(args.features), args.rows),
                             "features": args.features.name}
    save_dense_draft(draft, args.out)
    (args.out / CARD).write_text(json.dumps(card, indent=2) + "\n")
    log.info("exported the dense draft of %s (step %d) to %s", run_dir, state["step"], args.out)
    return 0


def _teacher_and_store(args):
    if not args.teacher or not args.features:
        raise SystemExit("dense-draft: --teacher FILE.gguf and --features STORE (made by the features stage) "
                         "are required")
    try:
        store = open_store_of(args.features, args.teacher)
    except FeatureStoreError as error:
        raise SystemExit(str(error)) from None
    teacher = load_model(args.teacher, packed=loads_packed(args.teacher, "auto")).train(False)
    return teacher, store


def _checkpoint_d2t(run_dir: Path):
    return checkpoint_state(run_dir)["model"]["d2t"]

