"""The mutable overlay over the static trie: files updated or removed since the last build.

Updated files contribute their units here (kept per file, so that the next update of the same
file replaces them exactly). Static entries of a changed or removed file are hidden by a
tombstone on the file: a static unit that occurs only in tombstoned files is gone; one that also
occurs elsewhere stays (its count is then an overestimate until the next compaction).
"""

import bisect
from collections import Counter

from prefixcache.extract import FileUnits


class Overlay:
    def __init__(self):
        self.units = Counter()  # unit -> occurrences in overlay files
        self.unit_file = {}  # unit -> path of the latest overlay file holding it
        self.follows = {}  # previous line -> Counter(next line)
        self.per_file = {}  # path -> FileUnits now in the overlay
        self.tombstones = set()  # static file indices whose static entries are hidden
        self.sorted_units = []  # sorted keys of self.units, for prefix search

    def __len__(self) -> int:
        return len(self.units)

    def remove(self, path: str) -> None:
        old = self.per_file.pop(path, None)
        if old is None:
            return
        for text, count in old.units.items():
            self._drop_unit(text, count)
        for pair, count in old.follows.items():
            self._drop_follow(pair, count)

    def add(self, path: str, found: FileUnits) -> None:
        """The file's units become `found`. A file updated again (every keystroke) changes only
        the units whose counts differ from its previous version."""
        old = self.per_file.get(path)
        self.per_file[path] = found
        if old is None:
            for text, count in found.units.items():
                self._add_unit(text, count, path)
            for pair, count in found.follows.items():
                self._add_follow(pair, count)
            return
        self._apply_difference(old.units, found.units, lambda text, n: self._add_unit(text, n, path), self._drop_unit)
        self._apply_difference(old.follows, found.follows, self._add_follow, self._drop_follow)

    @staticmethod
    def _apply_difference(old: Counter, new: Counter, add, drop) -> None:
        for key in old.keys() - new.keys():
            drop(key, old[key])
        for key in new.keys() - old.keys():
            add(key, new[key])
        for key in old.keys() & new.keys():
            change = new[key] - old[key]
            if change > 0:
                add(key, change)
            elif change < 0:
                drop(key, -change)

    def _add_unit(self, text: str, count: int, path: str) -> None:
        if text not in self.units:
            bisect.insort(self.sorted_units, text)
        self.units[text] += count
        self.unit_file[text] = path

    def _drop_unit(self, text: str, count: int) -> None:
        left = self.units[text] - count
        if left > 0:
            self.units[text] = left
            return
        del self.units[text]
        self.unit_file.pop(text, None)
        i = bisect.bisect_left(self.sorted_units, text)
        if i < len(self.sorted_units) and self.sorted_units[i] == text:
            self.sorted_units.pop(i)

    def _add_follow(self, pair: tuple, count: int) -> None:
        prev, line = pair
        nexts = self.follows.get(prev)
        if nexts is None:
            nexts = self.follows[prev] = Counter()
        nexts[line] += count

    def _drop_follow(self, pair: tuple, count: int) -> None:
        prev, line = pair
        nexts = self.follows.get(prev)
        if nexts is not None:
            nexts[line] -= count
            if nexts[line] <= 0:
                del nexts[line]

    def with_prefix(self, prefix: str, limit: int):
        """Up to `limit` (unit, count, path) whose text starts with prefix."""
        out = []
        i = bisect.bisect_left(self.sorted_units, prefix)
        while i < len(self.sorted_units) and len(out) < limit:
            text = self.sorted_units[i]
            if not text.startswith(prefix):
                break
            out.append((text, self.units[text], self.unit_file.get(text)))
            i += 1
        return out
