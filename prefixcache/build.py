"""Building the unit tables of a repository, in parallel over processes for large trees."""

import hashlib
import multiprocessing as mp
import os
import sys
from collections import Counter
from pathlib import Path

from prefixcache.extract import extract
from prefixcache.files import list_files, read_source

MULTI_FILE = 1 << 31  # bit set in a unit's file index when it occurs in more than one file
PARALLEL_MIN_FILES = 64


def content_hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _index_chunk(args):
    """Worker: (root, [(file index, path)]) -> (units, follows, file records, skipped)."""
    root, chunk = args
    units, follows, files, skipped = {}, {}, [], Counter()
    for file_index, rel in chunk:
        text = read_source(Path(root), rel, skipped)
        if text is None:
            continue
        found = extract(rel, text)
        files.append((file_index, rel, content_hash(text), len(text), found.parsed))
        merge_units(units, found.units, file_index)
        merge_units(follows, found.follows, file_index)
    return units, follows, files, skipped


def merge_units(units: dict, found: Counter, file_index: int) -> None:
    """units: key -> [count, file index | MULTI_FILE flag]; the lowest file index is kept.

    Used for units (text keys) and for line-follows pairs ((previous, line) keys) alike, so that
    a tombstoned file hides exactly what only it contained.
    """
    for text, count in found.items():
        entry = units.get(text)
        if entry is None:
            units[text] = [count, file_index]
        else:
            entry[0] += count
            if (entry[1] & ~MULTI_FILE) != file_index:
                entry[1] = min(entry[1] & ~MULTI_FILE, file_index) | MULTI_FILE


def _merge_chunk_units(total: dict, part: dict) -> None:
    for text, (count, file_index) in part.items():
        entry = total.get(text)
        if entry is None:
            total[text] = [count, file_index]
        else:
            entry[0] += count
            entry[1] = min(entry[1] & ~MULTI_FILE, file_index & ~MULTI_FILE) | MULTI_FILE


def build_tables(root: Path, workers: int | None = None, progress: bool = False, exclude: tuple = ()):
    """-> (units, follows, files [{path, hash, chars, parsed}], skipped Counter, candidate count)."""
    paths = list_files(root, exclude)
    indexed = list(enumerate(paths))
    workers = workers or os.cpu_count() or 1
    if workers > 1 and len(paths) >= PARALLEL_MIN_FILES:
        size = max(1, len(paths) // (workers * 8))
        chunks = [(str(root), indexed[i : i + size]) for i in range(0, len(indexed), size)]
        with mp.get_context("fork").Pool(workers) as pool:
            results = _collect(pool.imap_unordered(_index_chunk, chunks), len(chunks), progress)
    else:
        chunks = [(str(root), indexed[i : i + 32]) for i in range(0, len(indexed), 32)]
        results = _collect(map(_index_chunk, chunks), len(chunks), progress)
    units, follows, records, skipped = {}, {}, [], Counter()
    for part_units, part_follows, part_files, part_skipped in results:
        _merge_chunk_units(units, part_units)
        _merge_chunk_units(follows, part_follows)
        records.extend(part_files)
        skipped.update(part_skipped)
    return units, follows, _renumber((units, follows), records), skipped, len(paths)


def _renumber(tables, records: list) -> list:
    """Files sorted by path, numbered densely; file indices in the tables remapped to match."""
    records.sort(key=lambda r: r[1])
    remap = {r[0]: new for new, r in enumerate(records)}
    for table in tables:
        for entry in table.values():
            flag = entry[1] & MULTI_FILE
            entry[1] = remap[entry[1] & ~MULTI_FILE] | flag
    return [{"path": r[1], "hash": r[2], "chars": r[3], "parsed": r[4]} for r in records]


def _collect(results, total: int, progress: bool) -> list:
    out = []
    for done, result in enumerate(results, 1):
        out.append(result)
        if progress:
            bar = "#" * (30 * done // total)
            print(f"\rindexing [{bar:<30}] {done}/{total} chunks", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return out
