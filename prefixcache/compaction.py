"""Folding the overlay into a new static index, from a snapshot, while the index stays in use.

Index.compact takes a snapshot under the index lock and then builds the new static index
without holding it: on CPython's Lib/ that takes 0.6 s, during which proposals and updates used
to wait. Swapping the new index in (under the lock again) carries over what changed since the
snapshot: files updated or removed meanwhile stay in the overlay, and their folded versions are
hidden by tombstones.
"""

from dataclasses import dataclass

import numpy as np

from prefixcache.overlay import Overlay
from prefixcache.store import StaticIndex
from prefixcache.tables import from_entries, merge


@dataclass(frozen=True)
class Snapshot:
    static: StaticIndex
    files: list  # [{path, hash, chars, parsed}] of the static index
    per_file: dict  # path -> FileUnits in the overlay (FileUnits are replaced, never changed)
    tombstones: frozenset  # static file indices hidden by the overlay


def snapshot(static: StaticIndex, files: list, overlay: Overlay) -> Snapshot:
    return Snapshot(static, list(files), dict(overlay.per_file), frozenset(overlay.tombstones))


def fold(snap: Snapshot) -> tuple[StaticIndex, list]:
    """(new static index, its files): the snapshot's visible static entries and its overlay files."""
    keep = [i for i in range(len(snap.files)) if i not in snap.tombstones]
    remap = np.zeros(max(1, len(snap.files)), dtype=np.int64)  # a tombstoned file's index maps to 0
    remap[keep] = np.arange(len(keep))
    files = [snap.files[i] for i in keep]
    parts = [snap.static.visible_tables(snap.tombstones, remap)]
    for rel, found in snap.per_file.items():
        files.append({"path": rel, "hash": "", "chars": 0, "parsed": found.parsed})
        new_file = len(files) - 1
        parts.append(from_entries({text: (count, new_file) for text, count in found.units.items()},
                                  {pair: (count, new_file) for pair, count in found.follows.items()}))
    return StaticIndex.build(merge(parts)), files


def carried_over(snap: Snapshot, overlay: Overlay, files: list) -> Overlay:
    """The overlay to keep over the folded index: what `overlay` (the current one) changed since
    the snapshot, with the folded versions of those files tombstoned."""
    file_index = {f["path"]: i for i, f in enumerate(files)}
    kept = Overlay()

    def hide(rel: str) -> None:
        if rel in file_index:
            kept.tombstones.add(file_index[rel])

    for rel, found in overlay.per_file.items():
        if snap.per_file.get(rel) is not found:  # updated since the snapshot
            hide(rel)
            kept.add(rel, found)
    for rel in snap.per_file.keys() - overlay.per_file.keys():  # removed since
        hide(rel)
    for i in overlay.tombstones - snap.tombstones:  # static files updated or removed since
        hide(snap.files[i]["path"])
    return kept
