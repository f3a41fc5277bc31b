"""Index: a repository's units in a static marisa trie plus a mutable overlay, and proposals from them."""

import itertools
import threading
import time
from collections import Counter
from pathlib import Path, PurePosixPath

from prefixcache import compaction
from prefixcache import propose as proposer
from prefixcache.build import build_tables, content_hash
from prefixcache.extract import extract
from prefixcache.files import list_files, read_source
from prefixcache.overlay import Overlay
from prefixcache.retrieve import SIMILAR_FLOOR, Chunk, Retriever
from prefixcache.store import StaticIndex, read_manifest, write_index
from prefixcache.tables import MULTI_FILE

COMPACT_UNITS = 50_000  # overlay units beyond which update() folds the overlay into a new trie


class Index:
    def __init__(self, root: Path, static: StaticIndex, files: list[dict], summary: dict):
        self.root = Path(root).resolve()
        self.static = static
        self.files = files  # [{path, hash, chars, parsed}], position = file index in the arrays
        self.file_index = {f["path"]: i for i, f in enumerate(files)}
        self.summary = summary
        self.overlay = Overlay()
        self.lock = threading.RLock()  # the server updates while the scheduler proposes
        self._compacting = threading.Lock()  # held by the one compaction running
        self._relative_paths = {}  # path as given -> relative path (absolute ones resolve symlinks once)
        self._retriever = None  # built on first use: it holds every file's text
        self._pending_texts = {}  # updates (text) and removals (None) made before it was built

    # building, loading, saving ------------------------------------------------------------

    @classmethod
    def build(cls, repo, workers: int | None = None, progress: bool = False, exclude=()) -> "Index":
        root = Path(repo).resolve()
        if not root.is_dir():
            raise FileNotFoundError(f"{repo}: not a directory")
        started = time.perf_counter()
        tables, files, skipped, listed = build_tables(root, workers, progress, tuple(exclude))
        static = StaticIndex.build(tables)
        summary = {"exclude": list(exclude), "listed": listed, "indexed": len(files), "skipped": dict(skipped), "units": len(static.trie),
                   "follow_pairs": int(len(static.follow_ids)), "source_chars": sum(f["chars"] for f in files),
                   "build_seconds": round(time.perf_counter() - started, 3), "built_at": time.time()}
        return cls(root, static, files, summary)

    @classmethod
    def load(cls, directory) -> "Index":
        manifest = read_manifest(Path(directory))
        static = StaticIndex.load(Path(directory), manifest.get("data", {}))
        return cls(Path(manifest["root"]), static, manifest["files"], manifest.get("summary", {}))

    def save(self, directory) -> None:
        if len(self.overlay) or self.overlay.tombstones:
            self.compact()
        with self.lock:  # one static index with its own files, even if a compaction swaps them next
            static, files = self.static, self.files
        write_index(Path(directory), static, {"root": str(self.root), "files": files, "summary": self.summary})

    # updating -----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The repository's name, as a prompt's repository header gives it: its root folder's."""
        return self.root.name

    def relative(self, path) -> str:
        """A repository-relative POSIX path for a relative or absolute (inside the root) path."""
        known = self._relative_paths.get(path) if isinstance(path, str) else None
        if known is not None:  # every keystroke asks for the same file: skip pathlib
            return known
        rel = self._relative(path)
        if isinstance(path, str):
            if len(self._relative_paths) > 4096:
                self._relative_paths.clear()
            self._relative_paths[path] = rel
        return rel

    def _relative(self, path) -> str:
        p = Path(path)
        if p.is_absolute():
            try:
                p = p.resolve().relative_to(self.root)
            except ValueError:
                raise ValueError(f"{path}: outside the indexed repository {self.root}") from None
        rel = PurePosixPath(p.as_posix())
        if ".." in rel.parts:
            raise ValueError(f"{path}: escapes the indexed repository")
        return str(rel)

    def update(self, path, text: str, edited: bool = True) -> None:
        """Replace the file's units with those of `text`; visible to the very next proposal.
        edited=False: not a user's edit (an evaluation's cut at its cursor), so retrieval does
        not offer the changed lines as recent edits."""
        rel = self.relative(path)
        found = extract(rel, text)
        with self.lock:
            self._tombstone(rel)
            self.overlay.add(rel, found)
            grown = len(self.overlay) > COMPACT_UNITS
            self._retriever_update(rel, text, edited)
        if grown:
            self._compact_soon()

    def remove(self, path) -> None:
        rel = self.relative(path)
        with self.lock:
            self._tombstone(rel)
            self.overlay.remove(rel)
            self._retriever_update(rel, None)

    def _retriever_update(self, rel: str, text: str | None, edited: bool = True) -> None:
        if self._retriever is None:
            self._pending_texts[rel] = text
        elif text is None:
            self._retriever.remove(rel)
        else:
            self._retriever.update(rel, text, edited)

    def _tombstone(self, rel: str) -> None:
        i = self.file_index.get(rel)
        if i is not None:
            self.overlay.tombstones.add(i)

    def refresh(self, progress: bool = False) -> dict:
        """Re-read the repository, updating only files whose content hash changed."""
        seen, changed, skipped = set(), 0, Counter()
        for rel in list_files(self.root, tuple(self.summary.get("exclude", ()))):
            text = read_source(self.root, rel, skipped)
            if text is None:
                continue
            seen.add(rel)
            digest = content_hash(text)
            with self.lock:  # file indices change when a background compaction swaps the index
                i = self.file_index.get(rel)
                known = i is not None and i not in self.overlay.tombstones and self.files[i]["hash"] == digest
                known = known or rel in self.overlay.per_file
            if not known:
                self.update(rel, text)
                changed += 1
        with self.lock:
            removed = [f["path"] for f in self.files if f["path"] not in seen]
        for rel in removed:
            self.remove(rel)
        return {"changed": changed, "removed": len(removed), "unchanged": len(seen) - changed}

    def compact(self) -> None:
        """Fold the overlay into a fresh static trie (a full rebuild of the trie, not of the
        sources). Proposals and updates go on while it builds (see compaction.py); a second
        compaction waits for the first."""
        with self._compacting:
            self._compact()

    def _compact_soon(self) -> None:
        """Compact on a background thread, unless a compaction is running already."""
        if self._compacting.acquire(blocking=False):
            threading.Thread(target=self._compact_and_release, name="index-compaction", daemon=True).start()

    def _compact_and_release(self) -> None:
        try:
            self._compact()
        finally:
            self._compacting.release()

    def _compact(self) -> None:
        with self.lock:
            snap = compaction.snapshot(self.static, self.files, self.overlay)
        static, files = compaction.fold(snap)
        with self.lock:
            self.overlay = compaction.carried_over(snap, self.overlay, files)
            self.static, self.files = static, files
            self.file_index = {f["path"]: i for i, f in enumerate(files)}

    # retrieving ---------------------------------------------------------------------------

    @property
    def retriever(self) -> Retriever:
        """The repository's windows and definitions (read from disk the first time)."""
        with self.lock:
            if self._retriever is None:
                retriever = Retriever()
                for f in self.files:
                    if f["path"] not in self._pending_texts:
                        text = read_source(self.root, f["path"], Counter())
                        if text is not None:
                            retriever.update(f["path"], text, edited=False)
                for rel, text in self._pending_texts.items():
                    if text is not None:
                        retriever.update(rel, text, edited=False)
                self._retriever, self._pending_texts = retriever, {}
            return self._retriever

    def prepare_retrieval(self) -> int:
        """Read every file for retrieval now (a server does it in the background); returns the windows."""
        return self.retriever.window_count

    def retrieve(self, before: str, after: str = "", path=None, budget_chars: int = 4000,
                 min_similarity: float = SIMILAR_FLOOR) -> list[Chunk]:
        """Chunks of other files for the prompt at a cursor (see retrieve.py), most relevant last."""
        rel = self.relative(path) if path else None
        candidates = [(c.source, (proposer.cursor_context(before)[0] + c.text).strip())
                      for c in self.propose(before, path=path, k=3) if c.source]
        return self.retriever.retrieve(before, after, rel, budget_chars, candidates, min_similarity)

    # proposing ----------------------------------------------------------------------------

    def propose(self, text_before_cursor: str, path=None, k: int = 8) -> list:
        """Up to k continuations of the unit under the cursor, best first (see propose.py)."""
        rel = self.relative(path) if path else None
        typed, previous = proposer.cursor_context(text_before_cursor)
        with self.lock:
            return self._propose(typed, previous, rel, k)

    def _propose(self, typed: str, previous: str | None, rel: str | None, k: int) -> list:
        entries = []
        if previous is not None:
            for line, count, source in self._following(previous):
                if line.startswith(typed) and len(line) > len(typed):
                    entries.append((line[len(typed) :], count, source, 4.0 + len(typed) / 4))
        for start in proposer.unit_starts(typed, rel):
            partial = typed[start:]
            if not partial:
                continue
            weight = 1.0 + len(partial) / 8 + (1.0 if start == 0 else 0.0)
            for unit, count, source in self._with_prefix(partial):
                entries.append((unit[len(partial) :], count, source, weight))
        return proposer.rank(entries, rel, k)

    def _hidden(self, owner: int) -> bool:
        """True for a static entry found only in a tombstoned (changed or removed) file."""
        return not owner & MULTI_FILE and owner in self.overlay.tombstones

    def _static_entry(self, kid: int):
        count, owner = int(self.static.counts[kid]), int(self.static.file_of[kid])
        return (0, owner) if self._hidden(owner) else (count, owner)

    def _source(self, owner: int):
        i = owner & ~MULTI_FILE
        return self.files[i]["path"] if i < len(self.files) else None

    def _with_prefix(self, partial: str):
        trie, seen = self.static.trie, set()
        for tier in self.static.tiers:
            seen.update(itertools.islice(tier.iterkeys(partial), proposer.PER_TIER))
        seen.update(itertools.islice(trie.iterkeys(partial), proposer.PER_PARTIAL))
        for unit in seen:
            count, owner = self._static_entry(trie.key_id(unit))
            if count:
                yield unit, count, self._source(owner)
        yield from self.overlay.with_prefix(partial, proposer.PER_PARTIAL)

    def _following(self, previous: str):
        static = self.static
        kid = static.trie.get(previous)
        if kid is not None:
            lo, hi = int(static.follow_offsets[kid]), int(static.follow_offsets[kid + 1])
            for nid, count, owner in zip(static.follow_ids[lo:hi].tolist(), static.follow_counts[lo:hi].tolist(),
                                         static.follow_file[lo:hi].tolist(), strict=True):
                if not self._hidden(owner) and self._static_entry(nid)[0]:
                    yield static.trie.restore_key(nid), count, self._source(owner)
        for line, count in self.overlay.follows.get(previous, {}).items():
            if count > 0:
                yield line, count, self.overlay.unit_file.get(line)
