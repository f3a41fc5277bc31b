"""The process group of expert parallelism: how ranks start, talk and stop, and where experts go.

Launched by torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment), over
torch.distributed: gloo on the CPU, NCCL on GPUs. Every collective has a timeout (the group's),
and rank 0 sends a heartbeat while it is idle, so a follower waiting for the next step tells a
dead or hung leader from a quiet one. A failed collective raises ExpertParallelError, naming the
rank and the cause; nothing waits forever.

Rank 0 (the leader) talks first: each message is a fixed-size int64 header broadcast from it,
then the message's payload. `Channel.lock` keeps a whole message, and the collectives of the
forward it announces, together, because the heartbeat runs on another thread.
"""

import datetime
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

HEADER = 8
OP_FORWARD, OP_HEARTBEAT, OP_STOP = 1, 2, 3
DEFAULT_TIMEOUT_S = 20.0


class ExpertParallelError(RuntimeError):
    """The expert-parallel group failed: a rank died, timed out or was never started."""


@dataclass
class Traffic:
    """What this rank sent to other ranks: bytes and collectives, in all and in the last forward."""

    bytes_sent: int = 0
    collectives: int = 0
    forwards: int = 0
    last_forward_bytes: int = 0
    _forward_start: int = 0

    def add(self, nbytes: int) -> None:
        self.bytes_sent += int(nbytes)
        self.collectives += 1

    def begin_forward(self) -> None:
        self._forward_start = self.bytes_sent

    def end_forward(self) -> None:
        self.forwards += 1
        self.last_forward_bytes = self.bytes_sent - self._forward_start


@dataclass
class Channel:
    """This rank's end of the group: collectives with timeouts, counted, errors made clear."""

    rank: int
    world: int
    device: torch.device
    timeout_s: float
    traffic: Traffic = field(default_factory=Traffic)
    lock: threading.RLock = field(default_factory=threading.RLock)
    broken: str | None = None
    on_failure: object = None  # called once with the error when the group fails (a server stops itself)
    _last_sent: float = 0.0
    _heartbeat: threading.Thread | None = None
    _closed: bool = False
    _wake: threading.Event = field(default_factory=threading.Event)

    # -- collectives, each counted and with its failure explained -------------------------

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.rank == 0:
            self.traffic.add(tensor.numel() * tensor.element_size() * (self.world - 1))
            self._last_sent = time.monotonic()
        self._run("broadcast", dist.broadcast, tensor, src=0)
        return tensor

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor, output_splits: list, input_splits: list):
        row_bytes = input.element_size() * (input.shape[1:].numel() if input.dim() > 1 else 1)
        self.traffic.add(row_bytes * sum(n for r, n in enumerate(input_splits) if r != self.rank))
        self._run("all_to_all", dist.all_to_all_single, output, input, output_splits, input_splits)
        return output

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        self.traffic.add(tensor.numel() * tensor.element_size() * (self.world - 1))
        out = [torch.empty_like(tensor) for _ in range(self.world)]
        self._run("all_gather", dist.all_gather, out, tensor.contiguous())
        return out

    def _run(self, name: str, fn, *args, **kwargs) -> None:
        if self.broken:
            raise ExpertParallelError(self.broken)
        try:
            fn(*args, **kwargs)
        except (RuntimeError, ValueError, OSError) as err:
            self.broken = (f"expert-parallel group failed on rank {self.rank} of {self.world} during {name} "
                           f"(a rank died or did not answer within {self.timeout_s:.0f} s): {err}")
            if callable(self.on_failure):
                self.on_failure(self.broken)
            raise ExpertParallelError(self.broken) from err

    # -- the leader's messages -----------------------------------------------------------

    def send_header(self, op: int, *values: int) -> None:
        header = torch.zeros(HEADER, dtype=torch.long, device=self.device)
        header[0] = op
        header[1 : 1 + len(values)] = torch.tensor(values, dtype=torch.long)
        self.broadcast(header)

    def receive_header(self) -> list[int]:
        header = torch.zeros(HEADER, dtype=torch.long, device=self.device)
        return self.broadcast(header).tolist()

    def start_heartbeat(self) -> None:
        """Rank 0: a header every timeout/4 s of silence, so that idle is not taken for dead."""
        def beat():
            while not self._closed and not self.broken:
                self._wake.wait(self.timeout_s / 8)
                with self.lock:
                    if self._closed or self.broken or time.monotonic() - self._last_sent < self.timeout_s / 4:
                        continue
                    try:
                        self.send_header(OP_HEARTBEAT)
                    except ExpertParallelError:
                        return
        self._heartbeat = threading.Thread(target=beat, daemon=True, name="ep-heartbeat")
        self._heartbeat.start()

    def close(self) -> None:
        """Rank 0 tells the followers to stop; every rank then leaves the group."""
        with self.lock:
            if self._closed:
                return
            self._closed = True
            self._wake.set()
            if self.rank == 0 and not self.broken:
                try:
                    self.send_header(OP_STOP)
                except ExpertParallelError:
                    pass
        if self._heartbeat is not None:
            self._heartbeat.join()
        if dist.is_initialized():
            if not self.broken:  # leave together: a rank tearing its pairs down under a peer's read aborts
                try:
                    self._run("barrier", dist.barrier)
                except ExpertParallelError:
                    pass
            dist.destroy_process_group()


def init_channel(timeout_s: float | None = None) -> Channel:
    """Join the group torchrun set up; ExpertParallelError when not launched by it."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ExpertParallelError(f"--expert-parallel needs torchrun (missing {', '.join(missing)}); "
                                  "e.g. torchrun --nproc-per-node 2 -m specdec.cli complete ... --expert-parallel")
    timeout_s = float(os.environ.get("SPECDEC_EP_TIMEOUT", timeout_s or DEFAULT_TIMEOUT_S))
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        backend, device = "nccl", torch.device("cuda", local)
    else:
        backend, device = "gloo", torch.device("cpu")
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    except (RuntimeError, ValueError) as err:
        raise ExpertParallelError(f"cannot join the expert-parallel group: {err}") from err
    return Channel(dist.get_rank(), dist.get_world_size(), device, timeout_s)


# -- where the experts go -------------------------------------------------------------------


def placement(num_experts: int, world: int, load=None) -> list[list[int]]:
    """The experts of one MoE layer per rank, each rank holding num_experts / world of them.

    Without load: contiguous blocks. With load (tokens routed to each expert, as recorded), a
    greedy balance as EPLB does without replication: the busiest expert first, each to the
    least-loaded rank that still has room."""
    if num_experts % world:
        raise ExpertParallelError(f"{num_experts} experts per layer do not divide among {world} ranks")
    per_rank = num_experts // world
    if load is None:
        return [list(range(r * per_rank, (r + 1) * per_rank)) for r in range(world)]
    ranks, totals = [[] for _ in range(world)], [0.0] * world
    for expert in sorted(range(num_experts), key=lambda e: (-float(load[e]), e)):
        rank = min((r for r in range(world) if len(ranks[r]) < per_rank), key=lambda r: (totals[r], r))
        ranks[rank].append(expert)
        totals[rank] += float(load[expert])
    return [sorted(r) for r in ranks]


def rank_loads(load, layout: list[list[int]]) -> list[float]:
    """Tokens each rank's experts processed, from per-expert counts and a layout."""
    return [float(sum(float(load[e]) for e in experts)) for experts in layout]


def read_statistics(path) -> list[list[int]]:
    """Tokens per expert per MoE layer from a saved file: a results.json of `python -m specdec_eval`
    ("expert_load": {"tokens_per_expert": ...}) or {"tokens_per_expert": [[...], ...]}."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ExpertParallelError(f"{path}: cannot read expert statistics ({err})") from err
    counts = data.get("expert_load", data).get("tokens_per_expert") if isinstance(data, dict) else None
    if not isinstance(counts, list) or not all(isinstance(row, list) for row in counts):
        raise ExpertParallelError(f"{path}: no tokens_per_expert [[per expert] per MoE layer] in it")
    return counts
