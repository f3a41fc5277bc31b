"""Exact and near-duplicate file removal: MinHash over two-line shingles, with LSH banding.

Two files are near-duplicates when the Jaccard similarity of their sets of consecutive non-blank
line pairs (whitespace-normalised) is at least NEAR_DUPLICATE. Candidates come from LSH bands
of the signature and are confirmed on the estimate of all hashes; the first file in input order
is kept.
"""

import hashlib
import zlib

import numpy as np

NUM_HASHES = 64
BANDS = 16  # 4 rows a band: pairs at 0.8 similarity collide in some band with p > 0.99
NEAR_DUPLICATE = 0.8
_PRIME = (1 << 61) - 1


def _shingles(text: str) -> np.ndarray:
    lines = [" ".join(line.split()) for line in text.split("\n")]
    lines = [line for line in lines if line]
    # crc32, not hash(): str hashes change from process to process, and the corpus must not
    pairs = {zlib.crc32(f"{a}\n{b}".encode()) for a, b in zip(lines, lines[1:], strict=False)}
    pairs = pairs or {zlib.crc32(text.encode())}
    return np.fromiter(pairs, dtype=np.uint64, count=len(pairs))


def signature(text: str, seeds: np.ndarray) -> np.ndarray:
    """[NUM_HASHES] minimum of (a * x + b) mod p over the shingles."""
    x = _shingles(text)[None, :]  # [1, S]
    a, b = seeds[:, :1], seeds[:, 1:]
    return ((a * x + b) % _PRIME).min(axis=1)


def drop_duplicates(files) -> list:
    """files without exact or near duplicates of an earlier file (objects with a .text)."""
    rng = np.random.default_rng(0)
    seeds = rng.integers(1, 1 << 30, size=(NUM_HASHES, 2), dtype=np.uint64)
    seen_exact, buckets, kept, signatures = set(), {}, [], []
    rows = NUM_HASHES // BANDS
    for f in files:
        digest = hashlib.sha1(" ".join(f.text.split()).encode()).digest()
        if digest in seen_exact:
            continue
        seen_exact.add(digest)
        sig = signature(f.text, seeds)
        keys = [(band, sig[band * rows : (band + 1) * rows].tobytes()) for band in range(BANDS)]
        candidates = {i for key in keys for i in buckets.get(key, ())}
        if any(np.mean(signatures[i] == sig) >= NEAR_DUPLICATE for i in candidates):
            continue
        index = len(kept)
        kept.append(f)
        signatures.append(sig)
        for key in keys:
            buckets.setdefault(key, []).append(index)
    return kept
