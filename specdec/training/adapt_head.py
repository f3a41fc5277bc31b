"""An EAGLE-3 head adapted on the target's features, read through the native step.

A real target (a GGUF file) runs packed, as it serves: its features for a row come from one
native forward with the capture slot on (features.target_row), so the target never runs as
float32 PyTorch. Each row is extracted once and kept in memory; the head's steps then read the
rows again for as many epochs as the minutes allow, with the target's logits over the head's
draft vocabulary computed from the kept last-layer output (TeacherLogits), as the recipe's head
training does from its store. Agreement is measured on held-out rows extracted the same way, of
the head as written to disk and loaded as the engine loads it.
"""

import json
import logging
import time
from pathlib import Path

import torch

from specdec.models import native
from specdec.training.eagle3 import (
    TeacherLogits,
    build_head,
    head_loss_fn,
    load_head_weights,
    save_head,
    store_agreement,
)
from specdec.training.evaluate import by_hash
from specdec.training.features import FeatureBatch, FeatureRows, target_row
from specdec.training.train import cpu_has_bf16, in_bf16

log = logging.getLogger("specdec.adapt")

HELD_OUT_TOKENS = 8192  # of held-out files, measured before and after
MIN_ROW_TOKENS = 8


def reads_features(target, seq_len: int) -> bool:
    """Whether the target's native step can capture a training row's features in one forward."""
    if getattr(target, "native_step", None) is None:
        return False
    return bool(getattr(target, "packed", None)) or seq_len <= native.MAX_TOKENS


class HeadOnFeatures:
    """The student `specdec adapt` trains when the draft is an EAGLE-3 head and the target has
    a native step: the interface of adapt's students (kind, model, raw, tokenizer, loss)."""

    kind = "eagle3"

    def __init__(self, head, raw: dict, target, seq_len: int):
        self.model, self.raw, self.tokenizer, self.target = head, raw, target.tokenizer, target
        self.capture = tuple(head.config.capture_layers(target.config.num_layers))
        self.loss = head_loss_fn(None, stored=TeacherLogits(target, head))
        if cpu_has_bf16():  # as the recipe's head training: more steps in the same minutes
            self.loss = in_bf16(self.loss)
        self.seq_len, self.feature_tokens = seq_len, 0

    @classmethod
    def load(cls, draft_dir: Path, target, seq_len: int) -> "HeadOnFeatures":
        raw = json.loads((draft_dir / "config.json").read_text())
        head = build_head(raw, target)  # its embedding is the target's, frozen
        load_head_weights(head, draft_dir)
        return cls(head, raw, target, seq_len)

    def held_out(self, files) -> FeatureRows:
        """Rows of the held-out files (each file's first seq_len + 1 tokens), up to HELD_OUT_TOKENS."""
        rows = FeatureRows(self.target.config.hidden_size)
        tokens = 0
        for f in by_hash(files):
            ids = self.tokenizer.encode(f.text).ids[: self.seq_len + 1]
            if len(ids) < MIN_ROW_TOKENS:
                continue
            rows.append(target_row(self.target, ids, self.capture))
            tokens += len(ids) - 1
            if tokens >= HELD_OUT_TOKENS:
                break
        return rows

    def agreement(self, held: FeatureRows, directory: Path) -> float:
        """First-token agreement with the target's argmax on the held-out rows, of the head in
        `directory` as the engine loads it (packed with a packed target)."""
        from specdec.models.eagle import load_eagle3

        head = load_eagle3(directory, self.target)
        return store_agreement(head, self.target, held, rows=held.rows)["step0"]

    def batches(self, maker, greedy_rows: list, batch_size: int, own_per_batch: int, seed: int, deadline: float):
        """Extract the features of the target's greedy rows and of the sampler's rows until
        `deadline` (at least one row), then return step -> FeatureBatch over them, up to
        `own_per_batch` rows of each batch taken from the greedy ones."""
        hidden = self.target.config.hidden_size
        own, samples = FeatureRows(hidden), FeatureRows(hidden)
        for row in greedy_rows:
            own.append(target_row(self.target, row, self.capture))
        while time.time() < deadline or samples.rows == 0:
            samples.append(target_row(self.target, maker.batch(samples.rows, 1, self.seq_len)[0], self.capture))
        self.feature_tokens = (own.rows + samples.rows) * self.seq_len
        log.info("features: %d sampled rows and %d of the target's own completions (%d tokens)", samples.rows,
                 own.rows, self.feature_tokens)
        taken = min(own_per_batch, own.rows, batch_size - 1)  # every batch holds a sampled row

        def batch_at(step: int) -> FeatureBatch:
            drawn = samples.batch(step, batch_size - taken, seed)
            if not taken:
                return drawn
            mine = own.batch_of([(step * taken + i) % own.rows for i in range(taken)])
            return FeatureBatch(torch.cat([drawn.ids, mine.ids]), torch.cat([drawn.features, mine.features]),
                                torch.cat([drawn.final, mine.final]))

        return batch_at

    def save(self, out: Path) -> None:
        save_head(self.model, self.raw, out)
