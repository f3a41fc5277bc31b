"""Building the unit tables of a repository, in parallel over processes for large trees."""

import hashlib
import multiprocessing as mp
import os
import sys
from collections import Counter, _count_elements  # the C counting loop behind Counter(iterable)
from pathlib import Path
from queue import Empty

from prefixcache.extract import occurrences
from prefixcache.files import MAX_FILE_BYTES, list_files, read_source

MULTI_FILE = 1 << 31  # bit set in a unit's file index when it occurs in more than one file
PARALLEL_MIN_FILES = 64


def content_hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class _ChunkTable:
    """Counts of a chunk's occurrences with the first file of each and whether others have it,
    kept with C-level operations only (counting, set algebra); files arrive in index order."""

    def __init__(self):
        self.counts, self.owner, self.multi = Counter(), {}, set()

    def add(self, occurrences: list, file_index: int) -> None:
        _count_elements(self.counts, occurrences)
        keys = set(occurrences)
        seen = keys & self.owner.keys()
        self.multi |= seen
        self.owner.update(dict.fromkeys(keys - seen, file_index))

    def flat(self) -> tuple:
        """(keys, counts, owners) as parallel lists: a third of the pickling and unpickling time
        of the dict of lists, for the table a worker sends to the parent."""
        keys = list(self.counts)
        return keys, list(self.counts.values()), list(map(self._owner, keys))

    def entries(self) -> dict:
        """key -> [count, first file | MULTI_FILE], as merge_entries makes them."""
        return {key: [count, self._owner(key)] for key, count in self.counts.items()}

    def _owner(self, key) -> int:
        return self.owner[key] | MULTI_FILE if key in self.multi else self.owner[key]


def merge_entries(total: dict, part) -> None:
    """Adds part, (key, count, first file | MULTI_FILE) triples from files none of which is in
    total, to total: key -> [count, lowest file index | MULTI_FILE when in more than one].

    Used for units (text keys) and for line-follows pairs ((previous, line) keys) alike, so that
    a tombstoned file hides exactly what only it contained.
    """
    get = total.get
    for key, count, file_index in part:
        entry = get(key)
        if entry is None:
            total[key] = [count, file_index]
        else:
            entry[0] += count
            entry[1] = min(entry[1] & ~MULTI_FILE, file_index & ~MULTI_FILE) | MULTI_FILE


def build_tables(root: Path, workers: int | None = None, progress: bool = False, exclude: tuple = ()):
    """-> (units, follows, files [{path, hash, chars, parsed}], skipped Counter, candidate count)."""
    paths = list_files(root, exclude)
    indexed = list(enumerate(paths))
    workers = min(workers or os.cpu_count() or 1, max(1, len(paths) // PARALLEL_MIN_FILES))
    bar = _Progress(len(paths), progress)
    if workers > 1:
        parts = _run_workers(root, _balanced(root, indexed, workers), bar)
    else:
        parts = [_index_files(str(root), indexed, bar.advance)]
    bar.close()
    units, follows, records, skipped = parts[0][0], parts[0][1], [], Counter()
    for i, (part_units, part_follows, part_files, part_skipped) in enumerate(parts):
        if i:  # a worker's flat tables
            merge_entries(units, zip(*part_units, strict=True))
            previous, lines, counts, owners = part_follows
            merge_entries(follows, zip(zip(previous, lines, strict=True), counts, owners, strict=True))
        records.extend(part_files)
        skipped.update(part_skipped)
    return units, follows, _renumber((units, follows), records), skipped, len(paths)


def _balanced(root: Path, indexed: list, workers: int) -> list:
    """One list of files per worker, of about equal bytes, each in file-index order."""
    sizes = []
    for file_index, rel in indexed:
        try:
            size = (root / rel).stat().st_size
            sizes.append((size if size <= MAX_FILE_BYTES else 0, file_index, rel))  # too big: skipped unread
        except OSError:
            sizes.append((0, file_index, rel))
    shares, loads = [[] for _ in range(workers)], [0] * workers
    for size, file_index, rel in sorted(sizes, reverse=True):
        least = loads.index(min(loads))
        shares[least].append((file_index, rel))
        loads[least] += size
    return [sorted(share) for share in shares]


def _index_files(root: str, assigned: list, tick, flat: bool = False) -> tuple:
    """(units, follows, file records, skipped) of the assigned files, in one table each (as
    parallel lists when flat, with each follows key split in two)."""
    units, follows = _ChunkTable(), _ChunkTable()
    files, skipped = [], Counter()
    for file_index, rel in assigned:
        text = read_source(Path(root), rel, skipped)
        tick()
        if text is None:
            continue
        found_units, found_follows, parsed = occurrences(rel, text)
        files.append((file_index, rel, content_hash(text), len(text), parsed))
        units.add(found_units, file_index)
        follows.add(found_follows, file_index)
    if not flat:
        return units.entries(), follows.entries(), files, skipped
    pairs, counts, owners = follows.flat()
    return units.flat(), ([a for a, _ in pairs], [b for _, b in pairs], counts, owners), files, skipped


def _worker(root: str, assigned: list, queue) -> None:
    """A forked process: index its share, send progress ticks, then its tables (one message)."""
    done = [0]

    def tick():
        done[0] += 1
        if done[0] % 16 == 0:
            queue.put(("progress", 16))

    try:
        queue.put(("done", _index_files(root, assigned, tick, flat=True), done[0] % 16))
    except Exception as err:  # reported to the parent, which raises it
        queue.put(("error", f"{type(err).__name__}: {err}", 0))


def _run_workers(root: Path, shares: list, bar) -> list:
    """The parent indexes the first share itself while forked workers index the others, each
    into one table: the parent merges W tables, not one per chunk (merging was a third of the
    build), and its own table never crosses a pipe."""
    context = mp.get_context("fork")
    queue = context.Queue()
    procs = [context.Process(target=_worker, args=(str(root), share, queue), daemon=True) for share in shares[1:]]
    for proc in procs:
        proc.start()
    try:
        parts = [_index_files(str(root), shares[0], bar.advance)]
        while len(parts) <= len(procs):
            try:
                message = queue.get(timeout=1.0)
            except Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError("an indexing worker died") from None
                continue
            if message[0] == "progress":
                bar.advance(message[1])
            elif message[0] == "error":
                raise RuntimeError(f"indexing failed in a worker: {message[1]}")
            else:
                parts.append(message[1])
                bar.advance(message[2])
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
    return parts


class _Progress:
    def __init__(self, total: int, show: bool):
        self.total, self.show, self.done = total, show, 0

    def advance(self, count: int = 1) -> None:
        self.done += count
        if self.show and (self.done % 16 == 0 or self.done == self.total):
            bar = "#" * (30 * self.done // max(1, self.total))
            print(f"\rindexing [{bar:<30}] {self.done}/{self.total} files", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.show:
            print(file=sys.stderr)


def _renumber(tables, records: list) -> list:
    """Files sorted by path, numbered densely; file indices in the tables remapped to match."""
    records.sort(key=lambda r: r[1])
    remap = {r[0]: new for new, r in enumerate(records)}
    for table in tables:
        for entry in table.values():
            flag = entry[1] & MULTI_FILE
            entry[1] = remap[entry[1] & ~MULTI_FILE] | flag
    return [{"path": r[1], "hash": r[2], "chars": r[3], "parsed": r[4]} for r in records]
