"""Keeping what the server loads at start-up out of the garbage collector's full passes.

A full collection scans every object the collector tracks. With the models, the tokenizer and
an index loaded there are hundreds of thousands, and one pass stops every thread long enough to
be felt: the event loop's /health and the scheduler's steps alike, several times a minute under
load. What
is loaded at start-up lives as long as the process, so once it is loaded it is moved to the
collector's permanent generation (gc.freeze), and later passes scan only newer objects.

The process's heap must also stay flat once the prompt cache is full: see return_freed_caches.
"""

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
CACHE_SIZED_BYTES = 1 << 20  # KV caches of a ~1,000-token prompt are several MB; a step's scratch is smaller


def freeze_what_is_loaded() -> None:
    """After loading models or an index: collect once (what replaced models or an index left
    behind may be cyclic garbage), then freeze everything that remains."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def unfreeze() -> None:
    """At shutdown, so that the interpreter finalises the loaded objects as usual."""
    gc.unfreeze()


def return_freed_caches() -> bool:
    """Serve allocations of a KV cache's size from their own mappings (glibc), so that a cache
    the prompt cache evicts goes back to the system when it is freed.

    By default glibc raises its mmap threshold to the size of each mapping freed, so after the
    first evictions caches of every size come from the heap, whose free gaps it rarely gives
    back: RSS kept rising once the prompt cache had reached its cap, while the cache's own bytes
    stayed at the cap. Setting the threshold fixes it. True when set; other C libraries are left as they are."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        done = bool(libc and hasattr(libc, "mallopt") and libc.mallopt(M_MMAP_THRESHOLD, CACHE_SIZED_BYTES))
    except OSError:
        done = False
    if not done:
        log.info("mmap threshold left as the C library sets it")
    return done
