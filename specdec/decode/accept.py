"""Acceptance: which speculated tokens the target keeps.

Greedy: walk down from the root; at each node the target's argmax either is one of the node's
children (accept it, go on) or not (stop; the argmax is the bonus token). The result is exactly
what plain greedy decoding of the target produces.

Sampling: every proposal here is deterministic (greedy draft, trie, n-gram). At each node the
target's own token is sampled (inverse CDF of its distribution at a uniform number that depends
only on the seed and the token's position), and the child carrying that token, if any, is
accepted. Each emitted token is then exactly the token plain sampling with the same seed emits,
whatever the tree was: speculative sampling is lossless token for token, and a seeded request
is reproducible however the engine decided to speculate. With point-mass proposals this accepts
a node's children with probability sum p(c_i), the same as multi-candidate rejection sampling
(SpecInfer) would.
"""

from dataclasses import dataclass

import numpy as np
import torch

from specdec.decode.tree import TokenTree


@dataclass
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    banned: tuple = ()  # token ids never picked (llama.cpp's ignore_eos bans the end-of-generation tokens)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Accepted:
    nodes: list[int]  # accepted speculated nodes, in path order (root excluded)
    bonus: int  # the target's own next token after them


def target_probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """[vocab] logits -> probabilities after temperature, top-k and top-p."""
    logits = logits.float() / s.temperature
    if s.top_k and s.top_k < logits.numel():
        kth = torch.topk(logits, s.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if s.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, 0)
        drop = cumulative - sorted_probs > s.top_p  # keep the smallest set reaching top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        probs = probs / probs.sum()
    return probs


@dataclass
class Uniforms:
    """Uniform numbers in [0, 1) keyed by (seed, position): splitmix64 of both."""

    seed: int

    def at(self, position: int) -> float:
        z = (self.seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return ((z ^ (z >> 31)) >> 11) / float(1 << 53)


_MASK64 = (1 << 64) - 1


def accept(tree: TokenTree, logits: torch.Tensor, s: Sampling, uniforms: Uniforms | None = None,
           healing=None, position: int = 0) -> Accepted:
    """logits [len(tree), vocab] from the target for every tree node; `position` is the index
    of the token that follows the root (sampling draws the uniform of each position); healing:
    the prompt's token healing still to be spelled (fim.Healing), which holds the first nodes. The
    logits may be a CPU forward's numpy view: greedy rows then skip torch's per-op overhead."""
    if isinstance(logits, np.ndarray) and (healing is not None or not s.greedy or s.banned):
        logits = torch.from_numpy(logits)  # restricting and sampling work on tensors
    node, nodes = 0, []
    while True:
        row = logits[node]
        if healing is not None:
            row = _restrict(row, healing.allowed)
        if s.banned:
            row = _ban(row, s.banned)
        token = _target_token(row, s, uniforms, position + tree.depths[node])
        if healing is not None:
            healing = healing.after(token)
        child = tree.children[node].get(token)
        if child is None:
            return Accepted(nodes, token)
        nodes.append(child)
        node = child


def greedy_token(row: torch.Tensor) -> int:
    """The index of the row's largest value, the first of equals as torch.argmax takes it. A CPU
    row goes through numpy, whose argmax (same tie rule, NaN counted largest as in torch) costs
    a fraction of torch's per-op overhead, paid at every step of every request."""
    if isinstance(row, np.ndarray):
        return int(row.argmax())
    if row.device.type == "cpu" and row.dtype == torch.float32 and not row.requires_grad:
        return int(row.numpy().argmax())
    return int(torch.argmax(row))


def _restrict(row, allowed):
    masked = torch.full_like(row, float("-inf"))
    masked[allowed] = row[allowed]
    return masked


def _ban(row, banned):
    masked = row.clone()
    masked[list(banned)] = float("-inf")
    return masked


def _target_token(row, s: Sampling, uniforms: Uniforms | None, position: int) -> int:
    if s.greedy:
        return greedy_token(row)
    probs = target_probs(row, s)
    u = (uniforms or Uniforms(0)).at(position)
    cumulative = torch.cumsum(probs, 0)
    target = torch.tensor([u * float(cumulative[-1])], dtype=cumulative.dtype)
    index = min(int(torch.searchsorted(cumulative, target, right=True).item()), probs.numel() - 1)
    while index > 0 and probs[index] <= 0:  # fp32 rounding at the top end must not pick an impossible token
        index -= 1
    return index

