"""The static index on disk: a marisa trie of units plus count, file and line-follows arrays.

Layout of an index directory (all written to a temporary directory, then renamed into place):
  manifest.json   format version, repository root, files with content hashes, build time,
                  and the size and hash of every data file (to refuse truncated or corrupt ones)
  units.marisa    unit text -> key id (memory-mapped)
  arrays.npz      (deflated; small enough to read whole)
    counts        [n] uint16 occurrences of each unit (saturating)
    file_of       [n] uint32 index into manifest files of one file the unit occurs in, with
                  MULTI_FILE set when it occurs in others too
    follow_degree [n] uint16, follow_ids [m] uint32, follow_counts [m] uint16, follow_file [m]
                  uint32: for each line, the lines that follow it somewhere (CSR, offsets rebuilt
                  from the degrees), with the file of each pair as in file_of

Not every unit is kept: the trie holds what repeats (two or more occurrences) and short unique
units; long unique lines (mostly one-off statements and prose) would triple the index for
little gain, and the overlay keeps everything of the files being edited.
"""

import hashlib
import json
import os
import shutil
import time
import zipfile
from dataclasses import dataclass
from itertools import compress, repeat
from pathlib import Path

import marisa_trie
import numpy as np

from prefixcache.tables import COUNT, LINE, MULTI_FILE, PREVIOUS, Tables, from_columns, owner_stats

FORMAT_VERSION = 1
TIER_MIN_COUNTS = (64, 8)  # frequent units again in small tries, so a prefix search meets them first
DATA_FILES = ("units.marisa", "arrays.npz") + tuple(f"tier{i}.marisa" for i in range(len(TIER_MIN_COUNTS)))
_ARRAYS = ("counts", "file_of", "follow_ids", "follow_counts", "follow_file")
MAX_UNIQUE_UNIT_CHARS = 40
# marisa's default is 3 nested tries; 2 build, look up and walk prefixes faster for a slightly
# larger file (1 level would take the index past a quarter of the source bytes).
UNIT_TRIE_LEVELS = 2


def _hidden(owners: np.ndarray, hidden_file: np.ndarray) -> np.ndarray:
    """Owners (file index | MULTI_FILE) of entries found only in a hidden file."""
    single = (owners & MULTI_FILE) == 0
    base = owners & ~MULTI_FILE
    return single & hidden_file[np.minimum(base, len(hidden_file) - 1)] & (base < len(hidden_file))


def _renumbered(owners: np.ndarray, remap: np.ndarray) -> np.ndarray:
    return remap[owners & ~MULTI_FILE] | (owners & MULTI_FILE)


def _kept(keys: list, counts: np.ndarray) -> np.ndarray:
    """Units that repeat, and short unique ones that are not comments."""
    short = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys)) <= MAX_UNIQUE_UNIT_CHARS
    comment = np.fromiter(map(str.startswith, keys, repeat(("#", "//"))), dtype=bool, count=len(keys))
    return (counts >= 2) | (short & ~comment)


class IndexFormatError(ValueError):
    """An index directory that cannot be used, with the reason."""


@dataclass
class StaticIndex:
    trie: marisa_trie.Trie
    counts: np.ndarray
    file_of: np.ndarray
    follow_offsets: np.ndarray
    follow_ids: np.ndarray
    follow_counts: np.ndarray
    follow_file: np.ndarray
    tiers: tuple = ()  # marisa tries of the units with at least TIER_MIN_COUNTS[i] occurrences

    @classmethod
    def build(cls, tables: Tables) -> "StaticIndex":
        """The trie of the units worth keeping, with their counts, owners and line follows."""
        counts_all = tables.stats[:, COUNT]
        kept = np.flatnonzero(_kept(tables.keys, counts_all))
        keys = [tables.keys[i] for i in kept.tolist()]
        weights = counts_all[kept]
        trie = marisa_trie.Trie(keys, weights=weights.tolist(), num_tries=UNIT_TRIE_LEVELS)
        n = len(trie)
        trie_id = np.full(len(tables.keys), -1, dtype=np.int64)  # table index -> key id in the trie
        trie_id[kept] = np.fromiter(map(trie.key_id, keys), dtype=np.int64, count=len(keys))
        counts = np.zeros(n, dtype=np.uint16)
        file_of = np.zeros(n, dtype=np.uint32)
        counts[trie_id[kept]] = np.minimum(weights, 65535)
        file_of[trie_id[kept]] = tables.owners(tables.stats[kept])
        offsets, follow_ids, follow_counts, follow_file = _follow_arrays(trie_id, tables, n)
        # marisa's predictive search walks heavy subtrees first, not heavy keys, so a short
        # prefix (`self.`) would meet rare units first; the tiers put frequent ones up front.
        tiers = tuple(marisa_trie.Trie(list(compress(keys, (weights >= m).tolist()))) for m in TIER_MIN_COUNTS)
        return cls(trie, counts, file_of, offsets, follow_ids, follow_counts, follow_file, tiers)

    def visible_tables(self, hidden_files, remap: np.ndarray) -> Tables:
        """The entries not found only in hidden files, as tables, with file index i renumbered
        remap[i] (a hidden file's index, still the first of a unit found elsewhere too, maps to
        what remap says for it). For compaction: whole-array operations, not a loop per key."""
        items = self.trie.items()
        keys = [key for key, _ in items]
        ids = np.fromiter((key_id for _, key_id in items), dtype=np.int64, count=len(items))
        hidden = np.zeros(max(1, len(remap)), dtype=bool)  # by file index
        hidden[list(hidden_files)] = True
        owners = self.file_of.astype(np.int64)  # by key id
        row = np.full(len(self.trie), -1, dtype=np.int64)  # key id -> row in the tables
        shown = ~_hidden(owners, hidden)[ids]
        row[ids[shown]] = np.arange(int(shown.sum()))
        unit_owners = owners[ids[shown]]
        stats = owner_stats(np.column_stack([self.counts.astype(np.int64)[ids[shown]], _renumbered(unit_owners, remap)]))
        previous = row[np.repeat(np.arange(len(self.trie)), np.diff(self.follow_offsets.astype(np.int64)))]
        lines = row[self.follow_ids.astype(np.int64)]
        follow_owners = self.follow_file.astype(np.int64)
        kept = (previous >= 0) & (lines >= 0) & ~_hidden(follow_owners, hidden)
        follow_stats = owner_stats(np.column_stack([self.follow_counts.astype(np.int64)[kept],
                                                    _renumbered(follow_owners[kept], remap)]))
        return from_columns(list(compress(keys, shown.tolist())), stats, previous[kept], lines[kept], follow_stats)

    def save(self, directory: Path) -> dict:
        """Writes the data files; returns {name: {size, blake2b}} for the manifest."""
        self.trie.save(str(directory / "units.marisa"))
        for i, tier in enumerate(self.tiers):
            tier.save(str(directory / f"tier{i}.marisa"))
        degree = np.diff(self.follow_offsets.astype(np.int64)).astype(np.uint16)
        _write_npz(directory / "arrays.npz", dict(follow_degree=degree, **{name: getattr(self, name) for name in _ARRAYS}))
        return {name: _file_digest(directory / name) for name in DATA_FILES}

    @classmethod
    def load(cls, directory: Path, digests: dict) -> "StaticIndex":
        for name in DATA_FILES:
            path = directory / name
            if not path.exists():
                raise IndexFormatError(f"{directory}: missing {name}; rebuild the index")
            expected = digests.get(name)
            if expected is None or _file_digest(path) != expected:
                raise IndexFormatError(f"{directory}: {name} is truncated or corrupt; rebuild the index")
        trie = marisa_trie.Trie()
        trie.mmap(str(directory / "units.marisa"))
        try:
            with np.load(directory / "arrays.npz") as data:
                arrays = {name: data[name] for name in _ARRAYS}
                degree = data["follow_degree"].astype(np.uint32)
        except (KeyError, ValueError, OSError) as err:
            raise IndexFormatError(f"{directory}: arrays.npz is unreadable ({err}); rebuild the index") from None
        offsets = np.zeros(len(degree) + 1, dtype=np.uint32)
        np.cumsum(degree, out=offsets[1:])
        tiers = []
        for i in range(len(TIER_MIN_COUNTS)):
            tiers.append(marisa_trie.Trie())
            tiers[-1].mmap(str(directory / f"tier{i}.marisa"))
        index = cls(trie, follow_offsets=offsets, tiers=tuple(tiers), **arrays)
        n = len(trie)
        if len(index.counts) != n or len(index.file_of) != n or len(offsets) != n + 1 or offsets[-1] != len(index.follow_ids):
            raise IndexFormatError(f"{directory}: data files disagree in length; rebuild the index")
        return index


MAX_FOLLOWERS = 64  # per line, the most frequent followers; also bounds a proposal's work


def _follow_arrays(trie_id: np.ndarray, tables: Tables, n: int):
    """CSR arrays of each line's most frequent followers (count, then id, then file descending)."""
    rows = tables.follows
    prev, nxt = trie_id[rows[:, PREVIOUS]], trie_id[rows[:, LINE]]
    both = (prev >= 0) & (nxt >= 0)
    prev, nxt, cnt, own = prev[both], nxt[both], rows[both, 2], tables.owners(rows[both, 2:])
    order = np.lexsort((-own, -nxt, -cnt, prev))  # by line, then most frequent first
    prev, nxt, cnt, own = prev[order], nxt[order], cnt[order], own[order]
    group_start = np.searchsorted(prev, prev, side="left")
    kept = (np.arange(len(prev)) - group_start) < MAX_FOLLOWERS
    degree = np.bincount(prev[kept], minlength=n).astype(np.uint32)
    offsets = np.zeros(n + 1, dtype=np.uint32)
    np.cumsum(degree, out=offsets[1:])
    return (offsets, nxt[kept].astype(np.uint32), np.minimum(cnt[kept], 65535).astype(np.uint16),
            own[kept].astype(np.uint32))


def _write_npz(path: Path, arrays: dict) -> None:
    """np.savez_compressed at zlib level 1: a small fraction of its time for a few more bytes
    (bench/prefixcache_bench.py); np.load reads either."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for name, array in arrays.items():
            with archive.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)


def _file_digest(path: Path) -> dict:
    data = path.read_bytes()
    return {"size": len(data), "blake2b": hashlib.blake2b(data, digest_size=16).hexdigest()}


def write_index(directory: Path, static: StaticIndex, manifest: dict) -> None:
    """Write into a sibling temporary directory, then rename it into place."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        manifest = dict(manifest, format_version=FORMAT_VERSION, data=static.save(tmp), saved_at=time.time())
        (tmp / "manifest.json").write_text(json.dumps(manifest))
        old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
        if directory.exists():
            os.replace(directory, old)
        os.replace(tmp, directory)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_manifest(directory: Path) -> dict:
    directory = Path(directory)
    path = directory / "manifest.json"
    if not directory.is_dir():
        raise IndexFormatError(f"{directory}: no index here (not a directory); build one with `prefixcache index`")
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise IndexFormatError(f"{directory}: no manifest.json; not an index or an interrupted build") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise IndexFormatError(f"{directory}: manifest.json is corrupt; rebuild the index") from None
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if not isinstance(version, int):
        raise IndexFormatError(f"{directory}: manifest.json has no format version; rebuild the index")
    if version > FORMAT_VERSION:
        raise IndexFormatError(f"{directory}: index format {version} is newer than this version reads ({FORMAT_VERSION}); upgrade")
    if version < FORMAT_VERSION:
        raise IndexFormatError(f"{directory}: index format {version} is older than {FORMAT_VERSION}; rebuild the index")
    return manifest
