"""A compiled CPU step: the per-token stretches of the forward through torch.compile (inductor).

On a small model a CPU step is mostly dispatch: each of a few hundred small ops costs a few
microseconds of Python and ATen overhead, more than its arithmetic. Inductor fuses the norms,
RoPE, residuals, routing and the activation into a few generated C++ loops around the matmuls.

What is compiled is StepParts (specdec/models/model.py): the embedding and layer 0's projections, each
seam from one layer's attention output to the next layer's projections, and the last layer's
rest with the logits. Attention stays eager, since it loops over the batch's sequences, each
with its own cache and length; that keeps every compiled graph's shapes a function of the flat
token count alone, whatever the batch is made of. The graphs are dynamic in that count, with
one token specialised: a decode step, and everything else (trees, batches, prefill chunks).
All layers share one graph: their parameters are the graph's inputs. A compiled step records
no expert statistics (expert_load, experts_woken), which are Python-side bookkeeping.

Warm-up traces those shapes once. Inductor caches its generated code on disk (the FX graph
and AOT caches, under SPECDEC_COMPILE_CACHE or the user's cache directory), so a later start
only traces. The compiled step computes the same function in another order of floating-point
operations: logits agree with the eager step within float tolerance, and output stays lossless
to the compiled target (speculation verifies against the same compiled step it decodes with).
"""

import logging
import os
import time
from pathlib import Path

import torch

from specdec.models import native
from specdec.models.model import EAGER_STEP, Segment, StepParts, Transformer

log = logging.getLogger(__name__)

# Graphs per function: two token-count cases for each model compiled in the process (target,
# draft), with and without a row selection for the logits.
RECOMPILE_LIMIT = 32


def cache_dir() -> Path:
    """Where inductor keeps its generated code across processes."""
    configured = os.environ.get("SPECDEC_COMPILE_CACHE")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdec" / "inductor"


def compile_step(model: Transformer, warm_up: bool = True) -> float:
    """Compile `model`'s per-token step in place and, with warm_up, trace its shapes now.
    Returns the seconds spent (compiling, or loading from the disk cache)."""
    if model.device.type != "cpu":
        raise ValueError("the compiled step is for the CPU; CUDA runs the Triton kernels")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir()))
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    # Sizes of the token count that equal a weight's size must not be tied to it (duck sizing
    # would then specialise a prefill chunk of 512 tokens on an intermediate size of 512).
    torch.fx.experimental._config.use_duck_shape = False
    started = time.perf_counter()
    model.native_step = None  # the compiled step is then the whole forward
    model.step = StepParts(*(torch.compile(part, dynamic=True, fullgraph=True) for part in EAGER_STEP))
    if warm_up:
        _warm_up(model)
    seconds = time.perf_counter() - started
    log.info("compiled the CPU step of %s in %.1f s", model.path or "a model", seconds)
    return seconds


def uncompile_step(model: Transformer) -> None:
    model.step = EAGER_STEP
    native.bind(model)


@torch.inference_mode()
def _warm_up(model: Transformer) -> None:
    """One forward of each shape family: prefill (many tokens, every row's logits or the last
    row's), a tree (a few tokens), and a decode step (one token)."""
    cache = model.new_cache(16)
    for count, rows in ((3, None), (3, [2]), (1, None), (1, [0])):
        ids = torch.zeros(count, dtype=torch.long)
        positions = torch.arange(cache.length, cache.length + count)
        model(ids, positions, [Segment(cache, count)], logits_rows=rows)
        cache.keep_all()
