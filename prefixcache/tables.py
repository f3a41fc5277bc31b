"""Unit and line-follows tables as columns: a list of distinct unit texts beside numpy arrays.

A build counts every occurrence of every unit in every file, merges the tables of its worker
processes and hands the result to the static index. Kept as columns, each of those steps is a
few dict and numpy operations over whole arrays instead of a Python loop over ~270,000 keys
(merging dicts of [count, owner] lists was a third of a build's serial time).

Statistics are rows of (count, first file, last file): the lowest and highest index of a file
holding the key, so that merging is a sum, a min and a max, and "in more than one file" is
first != last. File indices follow path order, so the first file is also the lowest path.
"""

from dataclasses import dataclass
from itertools import count, repeat

import numpy as np

MULTI_FILE = 1 << 31  # bit set in an owner (file index) when the key occurs in more than one file
COUNT, FIRST, LAST = 0, 1, 2
PREVIOUS, LINE = 0, 1  # follows rows: previous line's unit index, line's unit index, then the statistics


@dataclass
class Tables:
    keys: list  # distinct unit texts
    stats: np.ndarray  # [len(keys), 3] int64: count, first file, last file
    follows: np.ndarray  # [m, 5] int64: previous, line (indices into keys), count, first file, last file

    def owners(self, stats: np.ndarray) -> np.ndarray:
        """First file, with MULTI_FILE set where the key occurs in more than one file."""
        return stats[:, FIRST] | np.where(stats[:, FIRST] != stats[:, LAST], MULTI_FILE, 0)

    def entries(self) -> tuple[dict, dict]:
        """({unit: (count, owner)}, {(previous, line): (count, owner)}): the tables as plain
        dicts, independent of key order (how tests compare a serial and a parallel build)."""
        owners, follow_owners = self.owners(self.stats).tolist(), self.owners(self.follows[:, 2:]).tolist()
        units = dict(zip(self.keys, zip(self.stats[:, COUNT].tolist(), owners, strict=True), strict=True))
        pairs = [(self.keys[a], self.keys[b]) for a, b in self.follows[:, :2].tolist()]
        return units, dict(zip(pairs, zip(self.follows[:, 2].tolist(), follow_owners, strict=True), strict=True))

    def renumber(self, remap: np.ndarray) -> None:
        """File indices i become remap[i] (remap keeps their order)."""
        for stats in (self.stats[:, 1:], self.follows[:, 3:]):
            stats[:] = remap[stats]


def group(codes: np.ndarray, stats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows with equal codes folded into one: counts summed, first files min, last files max;
    -> (distinct codes ascending, their statistics)."""
    if not len(codes):
        return codes, stats.reshape(0, 3)
    order = np.argsort(codes, kind="stable")
    codes, stats = codes[order], stats[order]
    starts = np.flatnonzero(np.concatenate(([True], codes[1:] != codes[:-1])))
    folded = np.empty((len(starts), 3), dtype=np.int64)
    folded[:, COUNT] = np.add.reduceat(stats[:, COUNT], starts)
    folded[:, FIRST] = np.minimum.reduceat(stats[:, FIRST], starts)
    folded[:, LAST] = np.maximum.reduceat(stats[:, LAST], starts)
    return codes[starts], folded


def _fold_dense(ids: np.ndarray, stats: np.ndarray, n: int) -> np.ndarray:
    """group() for ids that are exactly 0..n-1, without the sort."""
    folded = np.zeros((n, 3), dtype=np.int64)
    folded[:, FIRST] = np.iinfo(np.int64).max
    np.add.at(folded[:, COUNT], ids, stats[:, COUNT])
    np.minimum.at(folded[:, FIRST], ids, stats[:, FIRST])
    np.maximum.at(folded[:, LAST], ids, stats[:, LAST])
    return folded


def tabulate(units: list, unit_files: np.ndarray, follow_at: np.ndarray, follow_files: np.ndarray) -> Tables:
    """Tables of one process's occurrences: every unit occurrence with its file index, and the
    positions i in units whose line follows the line at i - 1, with their file index."""
    first_seen = {}  # unit -> position of its first occurrence: one C-level pass assigns ids
    positions = np.fromiter(map(first_seen.setdefault, units, count()), dtype=np.int64, count=len(units))
    dense = np.zeros(len(units), dtype=np.int64)
    dense[np.fromiter(first_seen.values(), dtype=np.int64, count=len(first_seen))] = np.arange(len(first_seen))
    ids = dense[positions]  # the keys, in order of first occurrence, numbered 0..n-1
    stats = _fold_dense(ids, _occurrence_stats(unit_files), len(first_seen))
    follows = _follow_rows(ids[follow_at - 1], ids[follow_at], _occurrence_stats(follow_files), len(first_seen))
    return Tables(list(first_seen), stats, follows)


def merge(parts: list) -> Tables:
    """One table of several processes' tables, each from files none of the others has."""
    if len(parts) == 1:
        return parts[0]
    keys = list(parts[0].keys)
    index = dict(zip(keys, range(len(keys)), strict=True))
    positions = [np.arange(len(keys))]  # each part's key -> index in the merged keys
    for part in parts[1:]:
        position = np.fromiter(map(index.get, part.keys, repeat(-1)), dtype=np.int64, count=len(part.keys))
        new = np.flatnonzero(position < 0)
        position[new] = np.arange(len(keys), len(keys) + len(new))
        new_keys = [part.keys[i] for i in new.tolist()]
        if part is not parts[-1]:  # the last part's keys are never looked up
            index.update(zip(new_keys, range(len(keys), len(keys) + len(new)), strict=True))
        keys.extend(new_keys)
        positions.append(position)
    stats = _fold_dense(np.concatenate(positions), np.concatenate([p.stats for p in parts]), len(keys))
    previous = np.concatenate([pos[p.follows[:, PREVIOUS]] for pos, p in zip(positions, parts, strict=True)])
    lines = np.concatenate([pos[p.follows[:, LINE]] for pos, p in zip(positions, parts, strict=True)])
    follow_stats = np.concatenate([p.follows[:, 2:] for p in parts])
    return Tables(keys, stats, _follow_rows(previous, lines, follow_stats, len(keys)))


def from_columns(keys: list, stats: np.ndarray, previous: np.ndarray, lines: np.ndarray, follow_stats: np.ndarray) -> Tables:
    """Tables of distinct keys with their statistics, and follows as (previous, line) indices into keys."""
    return Tables(keys, stats, _follow_rows(previous, lines, follow_stats, len(keys)))


def from_entries(units: dict, follows: dict) -> Tables:
    """Tables of {unit: [count, owner]} and {(previous, line): [count, owner]} dicts (owners as in
    owners()); pairs with a line that is not a unit are dropped."""
    keys = list(units)
    index = dict(zip(keys, range(len(keys)), strict=True))
    stats = owner_stats(np.array(list(units.values()), dtype=np.int64).reshape(-1, 2))
    pairs = [(index.get(a, -1), index.get(b, -1), count, owner) for (a, b), (count, owner) in follows.items()]
    rows = np.array(pairs, dtype=np.int64).reshape(-1, 4)
    rows = rows[(rows[:, PREVIOUS] >= 0) & (rows[:, LINE] >= 0)]
    return Tables(keys, stats, _follow_rows(rows[:, PREVIOUS], rows[:, LINE], owner_stats(rows[:, 2:]), len(keys)))


def owner_stats(count_owner: np.ndarray) -> np.ndarray:
    """(count, owner) rows -> (count, first, last) rows; a MULTI_FILE owner gets last = first + 1."""
    first = count_owner[:, 1] & ~MULTI_FILE
    multi = (count_owner[:, 1] & MULTI_FILE) != 0
    return np.column_stack([count_owner[:, 0], first, first + multi])


def _occurrence_stats(files: np.ndarray) -> np.ndarray:
    return np.column_stack([np.ones(len(files), dtype=np.int64), files, files])


def _follow_rows(previous: np.ndarray, lines: np.ndarray, stats: np.ndarray, n: int) -> np.ndarray:
    n = max(n, 1)
    codes, folded = group(previous * n + lines, stats)  # n * n < 2**63 for any real repository
    return np.column_stack([codes // n, codes % n, folded]).astype(np.int64).reshape(-1, 5)
