"""A packed corpus: training rows made once by SampleMaker, stored as uint16 in a compressed .npz.

It is what a machine without network trains from (a lent GPU has no PyPI): at most about 60 MB,
so that it travels with the working tree. Rows are read in a fixed permutation per epoch, so a
batch is again a pure function of the step.
"""

import logging
from pathlib import Path

import numpy as np

log = logging.getLogger("specdec.training")


def write_packed(maker, tokens: int, seq_len: int, out: Path, block_rows: int = 64) -> Path:
    """Rows of seq_len + 1 tokens from maker until `tokens` tokens are stored; returns out."""
    rows, step = [], 0
    while len(rows) * (seq_len + 1) < tokens:
        rows += maker.batch(step, block_rows, seq_len)
        step += 1
        if step % 50 == 0:
            log.info("packed %d rows (%.1fM tokens)", len(rows), len(rows) * (seq_len + 1) / 1e6)
    array = np.asarray(rows, dtype=np.uint16)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, rows=array)
    log.info("packed corpus: %s rows x %d tokens in %s (%.1f MB)", array.shape[0], array.shape[1], out,
             out.stat().st_size / 1e6)
    return out


class PackedBatches:
    def __init__(self, path: Path, seed: int):
        self.rows = np.load(path)["rows"]
        self.seed = seed
        self._epoch, self._order = None, None

    def batch(self, step: int, batch_size: int, seq_len: int) -> list:
        if self.rows.shape[1] != seq_len + 1:
            raise ValueError(f"the packed rows hold {self.rows.shape[1] - 1} + 1 tokens; pass --seq-len "
                             f"{self.rows.shape[1] - 1}")
        first = step * batch_size
        picks = [self._row(first + i) for i in range(batch_size)]
        return self.rows[picks].astype(np.int64)

    def _row(self, index: int) -> int:
        epoch, offset = divmod(index, len(self.rows))
        if epoch != self._epoch:
            self._epoch = epoch
            self._order = np.random.default_rng(self.seed * 1000 + epoch).permutation(len(self.rows))
        return int(self._order[offset])
