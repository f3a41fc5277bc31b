"""The experts a model's forwards chose: load per expert (imbalance reports, expert placement)
and the distinct experts of the latest forward (what a verify pass wakes).

An eager forward files each MoE layer's ids [N, top_k] on its block as the layer runs. The native
step returns all layers' ids at once [layers, N, top_k] and files them here whole: splitting
them into a view per block would pay torch's per-op overhead, cold after the native call, at
every decode step. Either way ids are kept as they came and counted only when read.
"""

import numpy as np
import torch

COUNT_EVERY = 32  # forwards whose expert ids are kept before they are counted (eager or native)


class NativeRoutes:
    """The native step's expert ids, [MoE layers, N, top_k] per forward: the latest, and those
    not yet counted into the blocks' loads. A plain object, so that filing them each step skips
    nn.Module's attribute machinery."""

    def __init__(self):
        self.latest: torch.Tensor | None = None  # None when an eager forward ran last
        self.uncounted: list = []


class ExpertStatistics:
    """Mixed into Transformer, which provides moe_blocks(), config and native_routes (NativeRoutes)."""

    def file_native_routes(self, ids: torch.Tensor) -> None:
        """The native step's expert ids of one forward, [MoE layers, N, top_k]."""
        log = self.native_routes
        log.latest = ids
        log.uncounted.append(ids)
        if len(log.uncounted) >= COUNT_EVERY:
            self._count_native()

    def forget_native_routes(self) -> None:
        """An eager forward is about to file its own ids on the blocks."""
        self.native_routes.latest = None

    def latest_routes(self) -> list:
        """The latest forward's ids, one [N, top_k] tensor per MoE layer ([] before any)."""
        if self.native_routes.latest is not None:
            return list(self.native_routes.latest)
        return [b.latest_ids for b in self.moe_blocks() if b.latest_ids is not None]

    def expert_load(self) -> torch.Tensor:
        """[num_moe_layers, E] tokens routed to each expert since the last reset."""
        blocks = self.moe_blocks()
        if not blocks:
            return torch.zeros(0, 0, dtype=torch.long)
        self._count_native()
        for block in blocks:
            block.count_routed()
        return torch.stack([b.tokens_per_expert for b in blocks])

    def experts_woken(self) -> int:
        """Distinct experts the latest forward ran, summed over the MoE layers (what a verify
        pass costs on a memory-bound device: each woken expert's weights are read once)."""
        routes = self.native_routes.latest
        if routes is not None:
            if routes.shape[1] == 1:  # one token (a decode step): its top-k experts are distinct
                return routes.numel()
            return _distinct_per_layer(routes.numpy().reshape(routes.shape[0], -1), self.config.num_experts)
        latest = self.latest_routes()
        if not latest:
            return 0
        if latest[0].shape[0] == 1:
            return sum(ids.numel() for ids in latest)
        if latest[0].device.type == "cpu":  # numpy: torch's per-op overhead was most of a tree step's statistics
            return _distinct_per_layer(np.stack([ids.numpy().reshape(-1) for ids in latest]), self.config.num_experts)
        ids = torch.stack([i.reshape(-1) for i in latest])  # [layers, N*A]: every layer ran the same tokens
        woken = torch.zeros(ids.shape[0], self.config.num_experts, dtype=torch.bool, device=ids.device)
        return int(woken.scatter_(1, ids, True).sum())

    def reset_expert_load(self) -> None:
        self.native_routes.latest, self.native_routes.uncounted = None, []
        for block in self.moe_blocks():
            block.latest_ids, block.uncounted_ids = None, []
            block.tokens_per_expert.zero_()

    def _count_native(self) -> None:
        """Fold the native forwards' ids kept since the last count into the blocks' counts."""
        pending = self.native_routes.uncounted
        if not pending:
            return
        ids = torch.cat([p.reshape(p.shape[0], -1) for p in pending], dim=1)  # [layers, all tokens * k]
        for block, layer_ids in zip(self.moe_blocks(), ids, strict=True):
            block.uncounted_ids.append(layer_ids)  # counted by the block, as its eager ids are
            block.count_routed()
        self.native_routes.uncounted = []


def _distinct_per_layer(ids: np.ndarray, num_experts: int) -> int:
    """ids [layers, any]: distinct (layer, expert) pairs."""
    woken = np.zeros((ids.shape[0], num_experts), dtype=bool)
    for layer, row in enumerate(ids):
        woken[layer, row] = True
    return int(np.count_nonzero(woken))
