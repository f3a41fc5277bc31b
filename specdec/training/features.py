"""A frozen target's features for EAGLE-3 training, extracted once and kept on disk.

An EAGLE-3 head learns from the target's hidden states (the inputs of three of its layers) and
its next-token distributions. For a real target each forward costs far more than the head's
training step, so the target runs once per training row, through the same forward that serves
(the packed native step for a GGUF file), and the head's epochs read the results back:

    STORE/manifest.json            what made the rows (target, layers, row length, corpus mix) and how many
    STORE/shard-00000.safetensors  ids int32 [R, T + 1], features bf16 [R, T, 4H]

The fourth slot of the features is the last layer's output before the final norm. The target's
distributions are not stored: the head's vocabulary is a fifth of the target's, and its loss reads
the target's logits over those tokens only, which training computes from that slot (the final
norm and the head vocabulary's rows of the LM head: a matrix the size of the head's own). So the
extraction skips the target's LM head, a third of a 0.5B model's work, and a row costs 7 KB per
token instead of the 600 KB its full logits would.

Row i is the corpus recipe's row (seed, i), so an interrupted extraction resumes at the row after
the last shard written, and a shard is written whole (a temporary file renamed) or not at all.
"""

import json
import logging
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdec.models.model import Segment

log = logging.getLogger("specdec.training")

ROWS_PER_SHARD = 16


class FeatureStoreError(ValueError):
    """A feature store that cannot be used as asked (made with other settings, or damaged)."""


@dataclass(frozen=True)
class FeatureSettings:
    """What the stored rows depend on: a store only grows with the same settings."""

    target: str  # the target file's name and size, e.g. "model.gguf:491400064"
    capture: tuple  # the target layers whose inputs are the head's features
    hidden: int
    seq_len: int  # tokens per row (the row holds one more: the last one's next token)
    seed: int
    mix: str  # the corpus recipe's sample mix


def target_identity(path: Path) -> str:
    """FeatureSettings.target for a target file: its name and size."""
    return f"{path.name}:{path.stat().st_size}"


def open_store_of(root: Path, target: Path) -> "FeatureStore":
    """The feature store at `root`, refused when it holds another target's features: a draft
    trained on them would learn to agree with a model that never verifies it."""
    store = FeatureStore.open(root)
    expected = target_identity(Path(target))
    if store.settings.target != expected:
        raise FeatureStoreError(f"{root} holds the features of {store.settings.target}, not of {expected}")
    return store


@dataclass(frozen=True)
class FeatureBatch:
    ids: torch.Tensor  # int64 [B, T + 1]
    features: torch.Tensor  # float32 [B, T, 3H]: the captured layers' inputs at tokens 0 .. T-1
    final: torch.Tensor  # float32 [B, T, H]: the last layer's outputs there (the target's logits, before norm and head)


class FeatureStore:
    def __init__(self, root: Path, settings: FeatureSettings, rows: int, shards: list[str]):
        self.root, self.settings, self.rows, self.shards = root, settings, rows, shards
        self._open = {}

    @classmethod
    def open(cls, root: Path, settings: FeatureSettings | None = None) -> "FeatureStore":
        """The store at `root`; with settings, one is created when absent, and a store made with
        other settings is refused (its rows would mix two targets or recipes)."""
        manifest = root / "manifest.json"
        if not manifest.exists():
            if settings is None:
                raise FeatureStoreError(f"{root}: no feature store (extract one with `python -m specdec.training features`)")
            root.mkdir(parents=True, exist_ok=True)
            store = cls(root, settings, 0, [])
            store._write_manifest()
            return store
        try:
            data = json.loads(manifest.read_text())
            stored = FeatureSettings(**{**data["settings"], "capture": tuple(data["settings"]["capture"])})
            rows, shards = int(data["rows"]), list(data["shards"])
        except (ValueError, KeyError, TypeError) as err:
            raise FeatureStoreError(f"{manifest}: not a feature store manifest ({err})") from None
        if settings is not None and settings != stored:
            changed = {k: (v, getattr(settings, k)) for k, v in asdict(stored).items() if getattr(settings, k) != v}
            raise FeatureStoreError(f"{root} was extracted with other settings (stored, asked): {changed}; "
                                    "use another store directory")
        return cls(root, stored, rows, shards)

    def append(self, rows: list[tuple]) -> None:
        """Write one shard of rows (ids, features [T, 4H]), then count it."""
        name = f"shard-{len(self.shards):05d}.safetensors"
        tensors = {"ids": torch.stack([torch.as_tensor(r[0], dtype=torch.int32) for r in rows]),
                   "features": torch.stack([r[1].to(torch.bfloat16) for r in rows])}
        partial = self.root / f".{name}.partial"
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(partial))
        os.replace(partial, self.root / name)
        self.shards.append(name)
        self.rows += len(rows)
        self._write_manifest()

    def _write_manifest(self) -> None:
        data = {"settings": asdict(self.settings), "rows": self.rows, "shards": self.shards}
        partial = self.root / ".manifest.json.partial"
        partial.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(partial, self.root / "manifest.json")

    def row_ids(self, index: int) -> torch.Tensor:
        return self._row("ids", index).long()

    def batch(self, step: int, batch_size: int, seed: int = 0) -> FeatureBatch:
        """batch_size stored rows drawn by (seed, step): the same batch for the same step."""
        if self.rows == 0:
            raise FeatureStoreError(f"{self.root}: the store holds no rows yet")
        return self.batch_of(drawn_rows(self.rows, step, batch_size, seed))

    def batch_of(self, picked: list[int]) -> FeatureBatch:
        """The stored rows `picked`, as one batch."""
        return feature_batch([self._row("ids", i) for i in picked], [self._row("features", i) for i in picked],
                             self.settings.hidden)

    def _row(self, key: str, index: int) -> torch.Tensor:
        shard, within = divmod(index, ROWS_PER_SHARD)
        handle = self._open.get(shard)
        if handle is None:
            handle = self._open[shard] = safe_open(str(self.root / self.shards[shard]), framework="pt")
        return handle.get_slice(key)[within]


class FeatureRows:
    """Feature rows kept in memory, for a run too short to be worth a store on disk (`specdec
    adapt`): the store's batch interface over rows appended as they are extracted."""

    def __init__(self, hidden: int):
        self.hidden, self.ids, self.features = hidden, [], []

    @property
    def rows(self) -> int:
        return len(self.ids)

    def append(self, row: tuple) -> None:
        """One row (ids, features [T, 4H]) as target_row gives it."""
        self.ids.append(torch.as_tensor(row[0], dtype=torch.int32))
        self.features.append(row[1].to(torch.bfloat16))

    def batch(self, step: int, batch_size: int, seed: int = 0) -> FeatureBatch:
        if not self.ids:
            raise FeatureStoreError("no feature rows were extracted")
        return self.batch_of(drawn_rows(self.rows, step, batch_size, seed))

    def batch_of(self, picked: list[int]) -> FeatureBatch:
        return feature_batch([self.ids[i] for i in picked], [self.features[i] for i in picked], self.hidden)


def drawn_rows(rows: int, step: int, batch_size: int, seed: int) -> list[int]:
    """The rows of a batch, drawn by (seed, step): the same batch for the same step."""
    rng = random.Random(seed * 1_000_003 + step)
    return [rng.randrange(rows) for _ in range(batch_size)]


def feature_batch(ids: list[torch.Tensor], features: list[torch.Tensor], hidden: int) -> FeatureBatch:
    """Rows of equal length as one batch: the captured layers' inputs apart from the last layer's output."""
    stacked = torch.stack(features).float()
    return FeatureBatch(torch.stack(ids).long(), stacked[..., : 3 * hidden], stacked[..., 3 * hidden :])


@torch.inference_mode()
def target_row(target, ids: list[int], capture: tuple) -> tuple:
    """(ids, features [T, 4H]) of one row of T + 1 tokens: the captured layers' inputs and the
    last layer's output, from one forward of the target over its first T tokens (a float model's
    native step runs at most native.MAX_TOKENS; a packed one's any length)."""
    if target.native_step is None:
        raise FeatureStoreError("feature extraction needs the native CPU step (it captures the last layer's output)")
    saved, length = target.capture_layers, len(ids) - 1
    target.capture_layers = (*capture, target.config.num_layers)
    try:
        # One row of logits: a float model's native step takes no forward that wants none.
        features = target.run(torch.tensor(ids[:-1]), torch.arange(length),
                              [Segment(target.new_cache(length), length)], logits_rows=[length - 1]).captured
    finally:
        target.capture_layers = saved
    return ids, features.to(torch.bfloat16)


def extract(target, row_at, store: FeatureStore, rows_wanted: int, max_minutes: float | None = None) -> bool:
    """Extend the store to rows_wanted rows (True), or stop after max_minutes at a shard's end
    (False; run again to resume). row_at(i) is row i of the corpus recipe (T + 1 tokens)."""
    started, capture = time.time(), store.settings.capture
    rows_wanted = -(-rows_wanted // ROWS_PER_SHARD) * ROWS_PER_SHARD  # whole shards: row i is in shard i // R
    while store.rows < rows_wanted:
        if max_minutes is not None and time.time() - started > max_minutes * 60:
            return False
        shard_started = time.time()
        first = store.rows
        rows = [target_row(target, row_at(first + i), capture) for i in range(ROWS_PER_SHARD)]
        store.append(rows)
        tokens = sum(len(r[0]) - 1 for r in rows)
        log.info("features: %d/%d rows (%d tokens this shard, %.0f tok/s)", store.rows, rows_wanted, tokens,
                 tokens / max(1e-9, time.time() - shard_started))
    return True
