"""Acceptance: which speculated tokens the target keeps.

Greedy: walk down from the root; at each node the target's argmax either is one of the node's
children (accept it, go on) or not (stop; the argmax is the bonus token). The result is exactly
what plain greedy decoding of the target produces.

Sampling: every proposal here is deterministic (greedy draft, trie, n-gram), so for a node with
children c_1..c_m the rule is multi-candidate rejection sampling with point-mass proposals
(SpecInfer): accept c_i with probability p(c_i); on rejection set p(c_i) = 0, renormalise, try
the next child; when all are rejected, sample the bonus from what is left. Each emitted token is
then distributed exactly as the target's next-token distribution.
"""

from dataclasses import dataclass

import torch

from specdec.tree import TokenTree


@dataclass
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

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


def accept(tree: TokenTree, logits: torch.Tensor, s: Sampling, generator=None, first_allowed=None) -> Accepted:
    """logits [len(tree), vocab] from the target for every tree node."""
    node, nodes = 0, []
    while True:
        row = logits[node]
        if first_allowed is not None and node == 0:
            row = _restrict(row, first_allowed)
        token, accepted_child = _choose(tree, node, row, s, generator)
        if accepted_child is None:
            return Accepted(nodes, token)
        nodes.append(accepted_child)
        node = accepted_child


def _restrict(row, allowed):
    masked = torch.full_like(row, float("-inf"))
    masked[allowed] = row[allowed]
    return masked


def _choose(tree, node, row, s: Sampling, generator):
    """(token, accepted child node or None)."""
    children = tree.children[node]
    if s.greedy:
        token = int(torch.argmax(row))
        return token, children.get(token)
    probs = target_probs(row, s)
    for token, child in children.items():
        p = float(probs[token])
        if p > 0 and float(torch.rand((), generator=generator)) < p:
            return token, child
        probs[token] = 0.0
        total = float(probs.sum())
        if total <= 0:
            break
        probs = probs / total
    return int(torch.multinomial(probs, 1, generator=generator)), None


def sample_token(row, s: Sampling, generator=None, allowed=None) -> int:
    """The target's own next token (plain decoding)."""
    if allowed is not None:
        row = _restrict(row, allowed)
    if s.greedy:
        return int(torch.argmax(row))
    return int(torch.multinomial(target_probs(row, s), 1, generator=generator))
