"""Expert parallelism: each rank holds E / world experts of every MoE layer, the rest replicated.

Every rank runs the same forward on the same tokens (rank 0, the leader, runs the engine and
announces each target forward to the followers: tokens, positions, segments, tree masks, and
the KV-cache operations since the last one, so that their replicated caches stay identical).
Attention and dense layers are computed everywhere; in each MoE layer a rank takes a slice of
the tokens, routes it, and sends every (token, expert) pair to the rank that holds the expert
(all-to-all), which runs its experts on what it received and sends the outputs back (all-to-
all); the slices' results are then gathered so that every rank has the layer's whole output.
Combination is done at the token's home rank in (token, slot) order, as one process does, so the
logits agree with one process to rounding.
"""

import logging
import threading
import weakref

import torch

import specdec_kernels as kernels
from specdec.models import native
from specdec.models.kvcache import KVCache
from specdec.models.model import Segment, SparseMoeBlock, Transformer
from specdec.parallel.distributed import OP_FORWARD, OP_HEARTBEAT, OP_STOP, Channel, ExpertParallelError, placement

log = logging.getLogger("specdec.parallel.expert_parallel")

# KV-cache operations replayed on the followers, as int64 records [code, cache id, arguments...]
NEW, CLONE, KEEP_ALL, KEEP, TRUNCATE, FREE = range(1, 7)


class ShardedMoe(SparseMoeBlock):
    """A SparseMoeBlock holding only this rank's experts (global ids in `experts`)."""

    def shard(self, channel: Channel, layout: list[list[int]]) -> None:
        self.channel, self.layout = channel, layout
        self.per_rank = len(layout[0])
        owner = torch.empty(sum(map(len, layout)), dtype=torch.long)
        local = torch.empty_like(owner)
        for rank, experts in enumerate(layout):
            owner[experts] = rank
            local[experts] = torch.arange(len(experts))
        self.owner, self.local = owner.to(channel.device), local.to(channel.device)

    def forward(self, x):
        weights, ids = self.route(x)  # [N, A], the same on every rank
        c, n, k = self.channel, x.shape[0], self.top_k
        chunk = -(-n // c.world)
        lo, hi = min(n, c.rank * chunk), min(n, (c.rank + 1) * chunk)
        pair_ids = ids[lo:hi].reshape(-1)  # this rank's pairs, in (token, slot) order
        destination = self.owner[pair_ids] * self.per_rank + self.local[pair_ids]
        order = torch.argsort(destination, stable=True)
        send_counts = torch.bincount(destination, minlength=c.world * self.per_rank)
        recv_counts = torch.empty_like(send_counts)
        c.all_to_all(recv_counts, send_counts, [self.per_rank] * c.world, [self.per_rank] * c.world)
        send_splits = send_counts.view(c.world, -1).sum(1).tolist()
        recv_splits = recv_counts.view(c.world, -1).sum(1).tolist()
        rows = x[lo + torch.div(order, k, rounding_mode="floor")]
        received = x.new_empty(sum(recv_splits), x.shape[1])
        c.all_to_all(received, rows, recv_splits, send_splits)
        experts = torch.arange(self.per_rank, device=x.device).repeat(c.world)
        local_ids = torch.repeat_interleave(experts, recv_counts)[:, None]
        outputs = received  # nothing routed here: an empty block to send back
        if received.shape[0]:
            outputs = kernels.fused_moe(received, self.experts.gate_up_proj, self.experts.down_proj,
                                        torch.ones(local_ids.shape, dtype=torch.float32, device=x.device), local_ids)
        returned = x.new_empty(rows.shape)
        c.all_to_all(returned, outputs, send_splits, recv_splits)
        per_pair = x.new_empty(returned.shape)
        flat_weights = weights[lo:hi].reshape(-1).to(x.dtype)
        per_pair[order] = returned * flat_weights[order, None]
        mine = per_pair.view(hi - lo, k, x.shape[1]).sum(dim=1)
        padded = x.new_zeros(chunk, x.shape[1])
        padded[: hi - lo] = mine
        out = torch.cat(c.all_gather(padded))[:n]
        return out + self.shared(x) if hasattr(self, "shared_expert") else out


class CacheLog:
    """The leader's record of KV-cache operations not yet sent, and the ids of live caches."""

    def __init__(self):
        self.records: list[int] = []
        self.lock = threading.Lock()
        self.next_id = 1

    def add(self, *record: int) -> None:
        with self.lock:
            self.records += record

    def new_id(self) -> int:
        with self.lock:
            self.next_id += 1
            return self.next_id - 1

    def drain(self) -> list[int]:
        with self.lock:
            records, self.records = self.records, []
            return records


class MirroredKVCache(KVCache):
    """The leader's KVCache: every change outside the forward is logged for the followers."""

    def bind(self, log_: CacheLog, created=None) -> "MirroredKVCache":
        """Give the cache an id and log its creation: `created(id)` is the record (default NEW)."""
        self.log, self.mirror_id = log_, log_.new_id()
        log_.add(*(created(self.mirror_id) if created else (NEW, self.mirror_id, self.capacity)))
        weakref.finalize(self, log_.add, FREE, self.mirror_id)
        return self

    def keep_all(self) -> None:
        super().keep_all()
        self.log.add(KEEP_ALL, self.mirror_id)

    def keep(self, indices) -> None:
        indices = list(indices)
        super().keep(indices)
        self.log.add(KEEP, self.mirror_id, len(indices), *indices)

    def truncate(self, length: int) -> None:
        super().truncate(length)
        self.log.add(TRUNCATE, self.mirror_id, int(length))

    def clone(self, length: int | None = None, capacity: int = 0) -> "MirroredKVCache":
        copy = super().clone(length, capacity)
        copy.__class__ = MirroredKVCache
        length = -1 if length is None else int(length)
        return copy.bind(self.log, lambda new_id: (CLONE, new_id, self.mirror_id, length, int(capacity)))


def load_sharded(path, channel: Channel, layouts: list[list[list[int]]] | None = None,
                 dtype=torch.float32) -> Transformer:
    """This rank's model: replicated layers, and only its experts' tensors read from disk."""
    from specdec.models.config import ModelConfig
    from specdec.models.loader import load_model

    cfg = ModelConfig.from_file(f"{path}/config.json")
    if not cfg.num_experts:
        raise ExpertParallelError(f"{path}: --expert-parallel needs a Mixture-of-Experts target")
    if cfg.expert_bias:  # their biases and MXFP4 pairs are not yet read per shard
        raise ExpertParallelError(f"{path}: --expert-parallel does not support {cfg.architecture} yet")
    layers = sorted(cfg.sparse_layers)
    layouts = layouts or [placement(cfg.num_experts, channel.world) for _ in layers]
    if len(layouts) != len(layers):
        raise ExpertParallelError(f"expert statistics cover {len(layouts)} MoE layers; the target has {len(layers)}")
    mine = {layer: layout[channel.rank] for layer, layout in zip(layers, layouts, strict=True)}
    model = load_model(path, dtype=dtype, device=channel.device, experts=mine)
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    for block, layout in zip(blocks, layouts, strict=True):
        block.__class__ = ShardedMoe
        block.shard(channel, layout)
    model.expert_layouts = layouts
    native.bind(model)  # a shard's experts are not the whole layer: it decodes eagerly
    return model


def lead(model: Transformer, channel: Channel) -> Transformer:
    """Rank 0: its target announces every forward and logs its caches' changes."""
    cache_log = CacheLog()
    plain_run = model.run  # forward() and the scheduler both go through run()

    def new_cache(capacity: int = 256) -> MirroredKVCache:
        cache = MirroredKVCache(model.config.num_layers, **model.cache_dims(), dtype=model.dtype,
                                device=model.device, capacity=capacity)
        return cache.bind(cache_log)

    def run(input_ids, positions, segments, logits_rows=None):
        with channel.lock:
            channel.traffic.begin_forward()
            _announce(channel, cache_log, input_ids, positions, segments, logits_rows)
            out = plain_run(input_ids, positions, segments, logits_rows)
            channel.traffic.end_forward()
            return out

    model.new_cache, model.run = new_cache, run
    channel.start_heartbeat()
    return model


def _announce(channel: Channel, cache_log: CacheLog, input_ids, positions, segments, logits_rows) -> None:
    masks = [s.tree_mask.reshape(-1) for s in segments if s.tree_mask is not None]
    table = [v for s in segments for v in (s.cache.mirror_id, s.length, int(s.tree_mask is not None))]
    rows = [] if logits_rows is None else torch.as_tensor(logits_rows).reshape(-1).tolist()
    ops = cache_log.drain()
    mask_total = sum(m.numel() for m in masks)
    channel.send_header(OP_FORWARD, input_ids.numel(), len(segments), len(ops), -1 if logits_rows is None else len(rows),
                        mask_total)
    device = channel.device
    payload = torch.cat([input_ids.reshape(-1).to(device), positions.reshape(-1).to(device),
                         torch.tensor(table + rows + ops, dtype=torch.long, device=device)])
    channel.broadcast(payload)
    if mask_total:
        channel.broadcast(torch.cat(masks).to(device=device, dtype=torch.uint8))


def follow(model: Transformer, channel: Channel) -> int:
    """Ranks 1..: replay the leader's forwards until it says stop; 0 on a clean stop."""
    caches: dict[int, KVCache] = {}
    while True:
        header = channel.receive_header()
        op = header[0]
        if op == OP_HEARTBEAT:
            continue
        if op == OP_STOP:
            log.info("rank %d: stopped by the leader", channel.rank)
            return 0
        if op != OP_FORWARD:
            raise ExpertParallelError(f"rank {channel.rank}: unknown message {op} from the leader")
        _replay_forward(model, channel, caches, *header[1:6])


def _replay_forward(model, channel: Channel, caches: dict, n: int, n_segments: int, n_ops: int, n_rows: int,
                    mask_total: int) -> None:
    size = 2 * n + 3 * n_segments + max(0, n_rows) + n_ops
    payload = channel.broadcast(torch.empty(size, dtype=torch.long, device=channel.device))
    ids, positions = payload[:n], payload[n : 2 * n]
    rest = payload[2 * n :].tolist()
    table, rest = rest[: 3 * n_segments], rest[3 * n_segments :]
    rows, ops = (rest[:n_rows], rest[n_rows:]) if n_rows >= 0 else (None, rest)
    _apply_cache_ops(model, caches, ops)
    masks = channel.broadcast(torch.empty(mask_total, dtype=torch.uint8, device=channel.device)) if mask_total else None
    segments, used = [], 0
    for i in range(n_segments):
        cache_id, length, has_mask = table[3 * i : 3 * i + 3]
        mask = None
        if has_mask:
            mask = masks[used : used + length * length].view(length, length).bool()
            used += length * length
        segments.append(Segment(caches[cache_id], length, mask))
    model(ids, positions, segments, None if rows is None else torch.tensor(rows, dtype=torch.long))


def _apply_cache_ops(model, caches: dict, ops: list[int]) -> None:
    i = 0
    while i < len(ops):
        code, cache_id = ops[i], ops[i + 1]
        if code == NEW:
            caches[cache_id] = model.new_cache(ops[i + 2])
            i += 3
        elif code == CLONE:
            length = None if ops[i + 3] < 0 else ops[i + 3]
            caches[cache_id] = caches[ops[i + 2]].clone(length, ops[i + 4])
            i += 5
        elif code == KEEP_ALL:
            caches[cache_id].keep_all()
            i += 2
        elif code == KEEP:
            count = ops[i + 2]
            caches[cache_id].keep(ops[i + 3 : i + 3 + count])
            i += 3 + count
        elif code == TRUNCATE:
            caches[cache_id].truncate(ops[i + 2])
            i += 3
        elif code == FREE:
            caches.pop(cache_id, None)
            i += 2
        else:
            raise ExpertParallelError(f"unknown cache operation {code} from the leader")


def start(target_dir, statistics=None, timeout_s: float | None = None) -> tuple[Channel, Transformer]:
    """Join the group torchrun started and load this rank's share of the target; on rank 0 the
    model leads (announces its forwards). Expert placement is balanced from `statistics` (a
    saved tokens-per-expert file) when given, else contiguous."""
    from specdec.parallel.distributed import init_channel, read_statistics

    channel = init_channel(timeout_s)
    try:
        layouts = None
        if statistics is not None:
            counts = read_statistics(statistics)
            layouts = [placement(len(row), channel.world, row) for row in counts]
        model = load_sharded(target_dir, channel, layouts)
    except BaseException:
        channel.close()
        raise
    if channel.rank == 0:
        lead(model, channel)
    log.info("rank %d of %d: experts %s", channel.rank, channel.world,
             [layout[channel.rank] for layout in model.expert_layouts])
    return channel, model


def run(target_dir, statistics, leader) -> None:
    """Every rank's whole life under torchrun: rank 0 calls leader(model, channel) -> exit code
    (serving or completing), the others follow it. The process ends here, with the leader's code,
    or 1 (the reason printed) when it raised or the group failed."""
    import sys

    channel, model = start(target_dir, statistics)
    if channel.rank != 0:
        run_follower(model, channel)
    code, said = 1, None
    try:
        code = leader(model, channel)
    except Exception as err:  # the process ends below, without a traceback of its own
        said = str(err)
        print(f"specdec: error: {said}", file=sys.stderr)
    finally:
        channel.close()
        if channel.broken and channel.broken != said:
            print(f"specdec: error: {channel.broken}", file=sys.stderr)
        leave(1 if channel.broken or said is not None else code)


def run_follower(model: Transformer, channel: Channel) -> int:
    """A follower's whole life: replay until stopped (0) or until the group fails (1, said why).

    The process ends here, without the interpreter's teardown: gloo's threads, finalised after
    the group is gone, abort the process now and then (std::terminate), turning a clean stop
    into a crash report."""
    import sys

    code = 1
    try:
        code = follow(model, channel)
    except ExpertParallelError as err:
        print(f"specdec: error: {err}", file=sys.stderr)
    finally:
        channel.close()
        leave(code)


def leave(code: int) -> None:
    """End an expert-parallel process after its group is closed, skipping the interpreter's
    teardown (see run_follower)."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
