"""The training loop: time-budgeted, resumable from checkpoints, logged; optional logit distillation."""

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.config import ModelConfig
from specdec.model import Transformer
from specdec.training.recipe import init_weights, train_forward

log = logging.getLogger("specdec.training")


@dataclass
class TrainSettings:
    minutes: float
    batch_size: int = 8
    seq_len: int = 512
    lr: float = 2e-3
    warmup_steps: int = 50
    aux_coef: float = 0.01
    kd_weight: float = 0.0  # > 0: mix in KL(teacher || student) with this weight
    kd_temperature: float = 1.0
    seed: int = 0
    checkpoint_minutes: float = 4.0


def build_model(raw_config: dict, seed: int) -> Transformer:
    model = Transformer(ModelConfig.from_dict(raw_config))
    model.tie_weights()
    init_weights(model, seed)
    return model


def _lr_at(step: int, total: int, s: TrainSettings) -> float:
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    progress = min(1.0, (step - s.warmup_steps) / max(1, total - s.warmup_steps))
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _loss(model, batch, s: TrainSettings, teacher=None):
    ids = torch.tensor(batch)
    inputs, labels = ids[:, :-1], ids[:, 1:]
    logits, aux = train_forward(model, inputs)
    vocab = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))
    total = loss + s.aux_coef * aux
    if teacher is not None and s.kd_weight > 0:
        with torch.no_grad():
            teacher_logits, _ = train_forward(teacher, inputs)
        t = s.kd_temperature
        kd = F.kl_div(
            F.log_softmax(logits.reshape(-1, vocab) / t, -1),
            F.log_softmax(teacher_logits.reshape(-1, vocab) / t, -1),
            log_target=True,
            reduction="batchmean",
        ) * t * t
        total = (1 - s.kd_weight) * total + s.kd_weight * kd
    return total, loss


def train(model: Transformer, batches, s: TrainSettings, run_dir: Path, teacher=None) -> Transformer:
    """Train for about s.minutes of wall time (the step count is fixed after timing the first steps)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(s.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.95), weight_decay=0.1)
    state = _resume(run_dir, model, optimizer)
    step, total_steps, elapsed = state["step"], state["total_steps"], state["elapsed"]
    for _ in range(step):  # replay the data stream so a resumed run sees the same batches
        next(batches)
    model.train()
    last_save, started = time.time(), time.time() - elapsed
    while total_steps is None or step < total_steps:
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, total_steps or 10**9, s)
        total, loss = _loss(model, next(batches), s, teacher)
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        elapsed = time.time() - started
        if total_steps is None and step == 10:
            total_steps = max(20, int(s.minutes * 60 / (elapsed / step)))
            log.info("timing: %.2f s/step -> %d steps in %.0f min", elapsed / step, total_steps, s.minutes)
        if step % 10 == 0:
            tokens = step * s.batch_size * s.seq_len
            log.info("step %d/%s loss %.4f tokens %d elapsed %.1f min", step, total_steps, loss.item(), tokens, elapsed / 60)
        if time.time() - last_save > s.checkpoint_minutes * 60:
            _save(run_dir, model, optimizer, step, total_steps, elapsed)
            last_save = time.time()
    _save(run_dir, model, optimizer, step, total_steps, elapsed)
    model.eval()
    return model


def _save(run_dir: Path, model, optimizer, step, total_steps, elapsed) -> None:
    tmp = run_dir / "checkpoint.pt.tmp"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                "total_steps": total_steps, "elapsed": elapsed}, tmp)
    os.replace(tmp, run_dir / "checkpoint.pt")  # atomic: an interrupted save never corrupts the last one


def _resume(run_dir: Path, model, optimizer) -> dict:
    path = run_dir / "checkpoint.pt"
    if not path.exists():
        return {"step": 0, "total_steps": None, "elapsed": 0.0}
    state = torch.load(path, weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    log.info("resumed from %s at step %d", path, state["step"])
    return state


@torch.no_grad()
def validation_metrics(model: Transformer, tokenizer, files, max_tokens: int = 60000, seq_len: int = 512) -> dict:
    """Plain left-to-right loss (nats/token) and bits per character on held-out files."""
    model.eval()
    nats, tokens, chars = 0.0, 0, 0
    for f in files:
        ids = tokenizer.encode(f.text).ids
        for start in range(0, len(ids) - 1, seq_len):
            chunk = torch.tensor(ids[start : start + seq_len + 1])[None]
            if chunk.shape[1] < 2:
                continue
            logits, _ = train_forward(model, chunk[:, :-1])
            nats += F.cross_entropy(logits[0], chunk[0, 1:], reduction="sum").item()
            tokens += chunk.shape[1] - 1
            chars += len(tokenizer.decode(chunk[0, 1:].tolist()))
            if tokens >= max_tokens:
                return _metrics(nats, tokens, chars)
    return _metrics(nats, tokens, chars)


def _metrics(nats, tokens, chars) -> dict:
    return {"loss": nats / tokens, "bits_per_char": nats / math.log(2) / chars, "tokens": tokens, "chars": chars}
