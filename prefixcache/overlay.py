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
            left = self.units[text] - count
            if left > 0:
                self.units[text] = left
            else:
                del self.units[text]
                self.unit_file.pop(text, None)
                i = bisect.bisect_left(self.sorted_units, text)
                if i < len(self.sorted_units) and self.sorted_units[i] == text:
                    self.sorted_units.pop(i)
        for (prev, line), count in old.follows.items():
            nexts = self.follows.get(prev)
            if nexts is not None:
                nexts[line] -= count
                if nexts[line] <= 0:
                    del nexts[line]

    def add(self, path: str, found: FileUnits) -> None:
        self.remove(path)
        self.per_file[path] = found
        for text, count in found.units.items():
            if text not in self.units:
                bisect.insort(self.sorted_units, text)
            self.units[text] += count
            self.unit_file[text] = path
        for (prev, line), count in found.follows.items():
            self.follows.setdefault(prev, Counter())[line] += count

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
