"""Keeping what the server loads at start-up out of the garbage collector's full passes.

A full collection scans every object the collector tracks. With the models, the tokenizer and
an index loaded there are about 300,000, and one pass stops every thread for about 200 ms: the
event loop's /health and the scheduler's steps alike, several times a minute under load. What
is loaded at start-up lives as long as the process, so once it is loaded it is moved to the
collector's permanent generation (gc.freeze), and later passes scan only newer objects.
"""

import gc


def freeze_what_is_loaded() -> None:
    """After loading models or an index: collect once (what replaced models or an index left
    behind may be cyclic garbage), then freeze everything that remains."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def unfreeze() -> None:
    """At shutdown, so that the interpreter finalises the loaded objects as usual."""
    gc.unfreeze()
