"""python -m specdec.training: train the embedded default tokenizer, MoE target and draft, and export them.

Every stage is resumable: rerunning the command continues from the last checkpoint in --runs.
"""

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch

from specdec.loader import save_model
from specdec.training.corpus import load_corpus
from specdec.training.recipe import VOCAB_SIZE, active_params, draft_config, target_config
from specdec.training.samples import SampleMaker
from specdec.training.tokenizer import SPECIAL_TOKENS, train_tokenizer
from specdec.training.train import TrainSettings, build_model, train, validation_metrics

log = logging.getLogger("specdec.training")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec.training", description=__doc__)
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="checkpoints and logs")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "default_models")
    parser.add_argument("--target-minutes", type=float, default=50.0)
    parser.add_argument("--draft-minutes", type=float, default=18.0)
    parser.add_argument("--kd-weight", type=float, default=0.5, help="0 disables distillation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    args.runs.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        handlers=[logging.StreamHandler(sys.stderr), logging.FileHandler(args.runs / "train.log")])
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_files, val_files = load_corpus()
    log.info("corpus: %d train files, %d validation files", len(train_files), len(val_files))
    tokenizer = _tokenizer(args.runs, train_files)
    special = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    report = {"train_files": len(train_files), "validation_files": len(val_files)}
    models = {}
    for name, make_config, minutes in (("target", target_config, args.target_minutes),
                                       ("draft", draft_config, args.draft_minutes)):
        raw = make_config(tokenizer.get_vocab_size(), special)
        model = build_model(raw, args.seed)
        settings = TrainSettings(minutes=minutes, seed=args.seed,
                                 kd_weight=args.kd_weight if name == "draft" else 0.0)
        batches = SampleMaker(train_files, tokenizer, seed=args.seed + (name == "draft")).batches(
            settings.batch_size, settings.seq_len)
        started = time.time()
        teacher = models.get("target")
        train(model, batches, settings, args.runs / name, teacher=teacher)
        metrics = validation_metrics(model, tokenizer, val_files)
        log.info("%s validation: %s", name, metrics)
        state = torch.load(args.runs / name / "checkpoint.pt", weights_only=False)
        report[name] = {
            "total_params": sum(p.numel() for p in model.parameters()),
            "active_params": active_params(model.config),
            "train_steps": state["step"],
            "train_tokens": state["step"] * settings.batch_size * settings.seq_len,
            "train_minutes": round(state["elapsed"] / 60, 1),
            "session_minutes": round((time.time() - started) / 60, 1),
            "validation": metrics,
        }
        models[name] = model
        _export(model, raw, tokenizer, args.out / name)
    (args.out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    log.info("exported to %s", args.out)
    return 0


def _tokenizer(runs: Path, train_files):
    from tokenizers import Tokenizer

    path = runs / "tokenizer.json"
    if path.exists():
        return Tokenizer.from_file(str(path))
    tokenizer = train_tokenizer((f.text for f in train_files), VOCAB_SIZE)
    tokenizer.save(str(path))
    log.info("tokenizer: %d tokens", tokenizer.get_vocab_size())
    return tokenizer


def _export(model, raw: dict, tokenizer, out: Path) -> None:
    """HF layout, weights stored in bf16 to keep the package small."""
    out.mkdir(parents=True, exist_ok=True)
    stored = build_model(raw, 0).to(torch.bfloat16)
    stored.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    save_model(stored, out, raw)
    tokenizer.save(str(out / "tokenizer.json"))
    generation = {"eos_token_id": raw["eos_token_id"], "pad_token_id": raw["pad_token_id"],
                  "do_sample": False, "max_new_tokens": 64}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "additional_special_tokens": SPECIAL_TOKENS[1:], "model_max_length": raw["max_position_embeddings"],
    }, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
