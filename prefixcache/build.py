"""Building the unit tables of a repository, in parallel over processes for large trees."""

import hashlib
import multiprocessing as mp
import os
import sys
from collections import Counter
from pathlib import Path
from queue import Empty

import numpy as np

from prefixcache.extract import occurrences
from prefixcache.files import MAX_FILE_BYTES, list_files, read_source
from prefixcache.tables import merge, tabulate

PARALLEL_MIN_FILES = 64
# Occurrences a process holds before counting them into a table: bounds its memory (~100 MB)
# on large trees; CPython's Lib/ (about 220,000 per process) stays one table.
CHUNK_OCCURRENCES = 1_000_000


def content_hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def build_tables(root: Path, workers: int | None = None, progress: bool = False, exclude: tuple = ()):
    """-> (Tables, files [{path, hash, chars, parsed}], skipped Counter, candidate count).

    Files are numbered in path order, so that the lowest file index of a unit is also the
    lowest path, whichever process counted it."""
    paths = sorted(list_files(root, exclude))
    indexed = list(enumerate(paths))
    workers = min(workers or os.cpu_count() or 1, max(1, len(paths) // PARALLEL_MIN_FILES))
    bar = _Progress(len(paths), progress)
    if workers > 1:
        parts = _run_workers(root, _largest_first(root, indexed), workers, bar)
    else:
        parts = [_index_files(str(root), indexed, bar.advance)]
    bar.close()
    tables = merge([part[0] for part in parts])
    records, skipped = [], Counter()
    for _, part_files, part_skipped in parts:
        records.extend(part_files)
        skipped.update(part_skipped)
    return tables, _renumber(tables, records, len(paths)), skipped, len(paths)


def _largest_first(root: Path, indexed: list) -> list:
    """The files by size, largest first: processes that take the next file when they are free
    then finish within about one small file of each other (fixed shares of equal bytes did
    not: one process regularly took 20% longer than the other)."""
    sizes = []
    for file_index, rel in indexed:
        try:
            size = (root / rel).stat().st_size
            sizes.append((size if size <= MAX_FILE_BYTES else 0, file_index, rel))  # too big: skipped unread
        except OSError:
            sizes.append((0, file_index, rel))
    return [(file_index, rel) for _, file_index, rel in sorted(sizes, key=lambda s: (-s[0], s[1]))]


def _claimed(jobs: list, next_job):
    """The jobs this process claims from a counter shared by all the indexing processes."""
    while True:
        with next_job.get_lock():
            i = next_job.value
            next_job.value = i + 1
        if i >= len(jobs):
            return
        yield jobs[i]


def _index_files(root: str, assigned, tick) -> tuple:
    """(Tables, file records, skipped) of the assigned files."""
    occurrences_so_far, tables = _Occurrences(), []
    files, skipped = [], Counter()
    for file_index, rel in assigned:
        text = read_source(Path(root), rel, skipped)
        tick()
        if text is None:
            continue
        found_units, found_follow_at, parsed = occurrences(rel, text)
        files.append((file_index, rel, content_hash(text), len(text), parsed))
        occurrences_so_far.add(file_index, found_units, found_follow_at)
        if len(occurrences_so_far.units) >= CHUNK_OCCURRENCES:
            tables.append(occurrences_so_far.table())
            occurrences_so_far = _Occurrences()
    return merge([*tables, occurrences_so_far.table()]), files, skipped


class _Occurrences:
    """Every unit occurrence of some files in one list, counted at once by C-level dict and numpy
    operations (table()) rather than file by file (which was twice as slow)."""

    def __init__(self):
        self.units, self.follow_at, self.files, self.unit_counts, self.follow_counts = [], [], [], [], []

    def add(self, file_index: int, units: list, follow_at: list) -> None:
        self.follow_at.append(np.array(follow_at, dtype=np.int64) + len(self.units))
        self.units += units
        self.files.append(file_index)
        self.unit_counts.append(len(units))
        self.follow_counts.append(len(follow_at))

    def table(self):
        files = np.array(self.files, dtype=np.int64)
        follow_at = np.concatenate(self.follow_at) if self.follow_at else np.zeros(0, dtype=np.int64)
        return tabulate(self.units, np.repeat(files, self.unit_counts), follow_at, np.repeat(files, self.follow_counts))


def _worker(root: str, assigned, queue) -> None:
    """A forked process: index the files it claims, send progress ticks, then its tables (one message)."""
    done = [0]

    def tick():
        done[0] += 1
        if done[0] % 16 == 0:
            queue.put(("progress", 16))

    try:
        queue.put(("done", _index_files(root, assigned, tick), done[0] % 16))
    except Exception as err:  # reported to the parent, which raises it
        queue.put(("error", f"{type(err).__name__}: {err}", 0))


def _run_workers(root: Path, jobs: list, workers: int, bar) -> list:
    """The parent indexes files itself while forked workers index others, each process taking
    the next unclaimed file and counting into one table: the parent merges W tables, not one
    per chunk (merging was a third of the build), and its own table never crosses a pipe."""
    context = mp.get_context("fork")
    queue, next_job = context.Queue(), context.Value("q", 0)
    procs = [context.Process(target=_worker, args=(str(root), _claimed(jobs, next_job), queue), daemon=True)
             for _ in range(workers - 1)]
    for proc in procs:
        proc.start()
    try:
        parts = [_index_files(str(root), _claimed(jobs, next_job), bar.advance)]
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


def _renumber(tables, records: list, listed: int) -> list:
    """Files sorted by path (their index order), numbered densely; the tables' file indices
    remapped to match (skipped files leave no gaps)."""
    records.sort()
    remap = np.zeros(max(1, listed), dtype=np.int64)
    remap[[r[0] for r in records]] = np.arange(len(records))
    tables.renumber(remap)
    return [{"path": r[1], "hash": r[2], "chars": r[3], "parsed": r[4]} for r in records]
