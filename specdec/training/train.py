"""The training loop: a token budget, resumable from checkpoints, logged; optional distillation.

The learning rate is warmup-stable-decay: constant after warmup, then a linear decay over the
last `decay_fraction` of the steps. A run stopped by its time limit resumes from its checkpoint
with the same schedule, and the batches are a pure function of the step, so stopping and
resuming changes nothing in what is trained.
"""

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.models.config import ModelConfig
from specdec.models.model import Transformer
from specdec.training.recipe import init_weights, train_forward

log = logging.getLogger("specdec.training")


@dataclass
class TrainSettings:
    tokens: int  # the whole run's budget; sets the step count and the schedule
    batch_size: int = 8
    seq_len: int = 1024
    lr: float = 2e-3
    warmup_steps: int = 100
    decay_fraction: float = 0.2
    aux_coef: float = 0.01
    kd_weight: float = 0.0  # > 0: mix in KL(teacher || student) with this weight
    kd_hard_weight: float = 0.0  # > 0: also cross-entropy on the teacher's argmax (its greedy choice)
    seed: int = 0
    checkpoint_minutes: float = 10.0
    max_minutes: float | None = None  # stop (with a checkpoint) after this long; rerun to resume
    max_steps: int | None = None  # stop (with a checkpoint) after this many steps of this session
    device: str = "cpu"
    bf16: bool = False  # on a CPU: the loss's products in bfloat16 (autocast); weights and optimizer stay float32

    @property
    def total_steps(self) -> int:
        return max(1, self.tokens // (self.batch_size * self.seq_len))


def build_model(raw_config: dict, seed: int) -> Transformer:
    model = Transformer(ModelConfig.from_dict(raw_config))
    model.tie_weights()
    init_weights(model, seed)
    return model


def lr_at(step: int, s: TrainSettings) -> float:
    total = s.total_steps
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    decay_start = int(total * (1 - s.decay_fraction))
    if step < decay_start:
        return s.lr
    return s.lr * max(0.05, 1 - (step - decay_start) / max(1, total - decay_start))


def batch_loss(model, batch, s: TrainSettings, teacher=None):
    ids = torch.as_tensor(batch, device=s.device)
    inputs, labels = ids[:, :-1], ids[:, 1:]
    with _autocast(s.device):
        logits, aux = train_forward(model, inputs)
    logits = logits.float().reshape(-1, logits.shape[-1])
    loss = F.cross_entropy(logits, labels.reshape(-1))
    total = loss + s.aux_coef * aux
    if teacher is not None and (s.kd_weight > 0 or s.kd_hard_weight > 0):
        with torch.no_grad(), _autocast(s.device):
            teacher_logits = train_forward(teacher, inputs)[0].float().reshape(logits.shape)
        soft = F.kl_div(F.log_softmax(logits, -1), F.log_softmax(teacher_logits, -1),
                        log_target=True, reduction="batchmean")
        hard = F.cross_entropy(logits, teacher_logits.argmax(-1))
        rest = 1 - s.kd_weight - s.kd_hard_weight
        total = rest * total + s.kd_weight * soft + s.kd_hard_weight * hard
    return total, loss


def _autocast(device: str):
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def in_bf16(loss_fn):
    """loss_fn with its forward under CPU autocast to bfloat16; the backward follows the
    forward's dtypes, and the gradients land on the float32 weights."""
    def loss(model, batch):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return loss_fn(model, batch)

    return loss


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16): elsewhere autocast to
    bfloat16 is emulated and slower than float32."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return any(line.startswith("flags") and " avx512_bf16" in line for line in info)
    except OSError:
        return False


def train(model, batch_at: Callable[[int], list], s: TrainSettings, run_dir: Path, teacher=None,
          loss_fn=None, logged: str = "loss") -> bool:
    """Train until the token budget is spent (True) or max_minutes pass (False, resumable).
    loss_fn(model, batch) -> (total, logged value); default: next-token loss (+ distillation).
    logged: the logged value's name in the log (a head's loss_fn gives its agreement, which rises)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(s.seed)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = new_optimizer(trained, s.lr, s.device)
    step, elapsed = _resume(run_dir, model, optimizer)
    loss_fn = loss_fn or (lambda m, batch: batch_loss(m, batch, s, teacher))
    if s.device.startswith("cuda"):
        loss_fn = torch.compile(loss_fn)
    elif s.bf16:
        loss_fn = in_bf16(loss_fn)
    model.train()
    last_save, session_start, first_step = time.time(), time.time(), step
    tokens_per_step = s.batch_size * s.seq_len
    while step < s.total_steps:
        if s.max_minutes is not None and time.time() - session_start > s.max_minutes * 60:
            break
        if s.max_steps is not None and step - first_step >= s.max_steps:
            break
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, s)
        started = time.time()
        loss = optimizer_step(model, optimizer, trained, loss_fn, batch_at(step))
        step += 1
        elapsed += time.time() - started
        if step % 20 == 0 or step == s.total_steps:
            log.info("step %d/%d %s %.4f lr %.2e tokens %d train %.1f min (%.0f tok/s)", step, s.total_steps,
                     logged, loss.item(), lr_at(step - 1, s), step * tokens_per_step, elapsed / 60,
                     tokens_per_step / max(1e-9, time.time() - started))
        if time.time() - last_save > s.checkpoint_minutes * 60:
            save_checkpoint(run_dir, model, optimizer, step, elapsed, tokens_per_step)
            last_save = time.time()
    save_checkpoint(run_dir, model, optimizer, step, elapsed, tokens_per_step)
    model.eval()
    return step >= s.total_steps


def new_optimizer(trained, lr: float, device: str = "cpu"):
    """The recipe's AdamW (betas 0.9/0.95, weight decay 0.1; fused on CUDA)."""
    return torch.optim.AdamW(trained, lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=device.startswith("cuda"))


def optimizer_step(model, optimizer, trained, loss_fn, batch):
    """One update on a batch, gradients clipped at norm 1; returns the logged loss."""
    total, loss = loss_fn(model, batch)
    optimizer.zero_grad(set_to_none=True)
    total.backward()
    torch.nn.utils.clip_grad_norm_(trained, 1.0)
    optimizer.step()
    return loss


def save_checkpoint(run_dir: Path, model, optimizer, step: int, elapsed: float, tokens_per_step: int) -> None:
    tmp = run_dir / "checkpoint.pt.tmp"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                "elapsed": elapsed, "tokens_per_step": tokens_per_step}, tmp)
    os.replace(tmp, run_dir / "checkpoint.pt")  # atomic: an interrupted save never corrupts the last one


def run_model(run_dir: Path) -> tuple[Transformer, dict, dict]:
    """(model, raw config, checkpoint state) of a run directory's checkpoint; SystemExit if none."""
    import json

    state = checkpoint_state(run_dir)
    if state is None:
        raise SystemExit(f"{run_dir}: no checkpoint.pt (train it first)")
    raw = json.loads((run_dir / "config.json").read_text())
    model = build_model(raw, 0)
    model.load_state_dict(state["model"])
    return model.eval(), raw, state


def trained_summary(state: dict) -> dict:
    """Steps, tokens and minutes of a run, from its checkpoint."""
    return {"train_steps": state["step"], "train_tokens": state["step"] * state.get("tokens_per_step", 8 * 1024),
            "train_minutes": round(state["elapsed"] / 60, 1)}


def checkpoint_state(run_dir: Path) -> dict | None:
    return torch.load(run_dir / "checkpoint.pt", weights_only=False, map_location="cpu") if has_checkpoint(run_dir) else None


def has_checkpoint(run_dir: Path) -> bool:
    """Whether a run would resume; cheaper than checkpoint_state, which loads the optimizer too."""
    return (run_dir / "checkpoint.pt").exists()


def _resume(run_dir: Path, model, optimizer) -> tuple[int, float]:
    state = checkpoint_state(run_dir)
    if state is None:
        return 0, 0.0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    log.info("resumed from %s at step %d", run_dir / "checkpoint.pt", state["step"])
    return state["step"], state["elapsed"]


@torch.no_grad()
def validation_metrics(model: Transformer, tokenizer, files, max_tokens: int = 60000, seq_len: int = 1024) -> dict:
    """Plain left-to-right loss (nats/token) and bits per character on held-out files, each from its start."""
    model.eval()
    nats, tokens, chars = 0.0, 0, 0
    device = model.device
    for f in files:
        ids = tokenizer.encode(f.text).ids[: seq_len + 1]
        if len(ids) < 2:
            continue
        chunk = torch.tensor(ids, device=device)[None]
        if model.packed:  # only the native step reads packed weights
            with torch.inference_mode():
                logits = model.logits(chunk[:, :-1])
        else:
            logits, _ = train_forward(model, chunk[:, :-1])
        nats += F.cross_entropy(logits[0].float(), chunk[0, 1:], reduction="sum").item()
        tokens += chunk.shape[1] - 1
        chars += len(tokenizer.decode(ids[1:]))
        if tokens >= max_tokens:
            break
    return {"loss": nats / max(1, tokens), "bits_per_char": nats / math.log(2) / max(1, chars),
            "tokens": tokens, "chars": chars}
