"""TokenTree: the speculated continuations of one sequence, merged into a tree rooted at its last committed token.

Node 0 is the root (the last committed token, whose logits are not computed yet); every other
node is a speculated token with a parent, a depth, where it came from, and an estimate of the
probability that the target accepts the path down to it (used to spend the node budget).
"""

import numpy as np
import torch

from specdec.models.model import Segment, StepInput


class TokenTree:
    def __init__(self, root_token: int):
        self.tokens = [root_token]
        self.parents = [-1]
        self.depths = [0]
        self.sources = ["root"]
        self.probs = [1.0]
        self.children = [{}]  # node -> {token: child node}

    def __len__(self) -> int:
        return len(self.tokens)

    def add_child(self, parent: int, token: int, source: str, prob: float) -> int:
        """A new node under `parent` (which has no child of this token yet); returns its index."""
        index = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.sources.append(source)
        self.probs.append(prob)
        self.children.append({})
        self.children[parent][token] = index
        return index

    def truncate(self, n: int) -> None:
        """Keep the first n nodes: every node comes after its parent, so they form a tree."""
        for nodes in (self.tokens, self.parents, self.depths, self.sources, self.probs, self.children):
            del nodes[n:]
        for kids in self.children:
            for token in [t for t, child in kids.items() if child >= n]:
                del kids[token]

    def ancestor_mask(self) -> torch.Tensor:
        """[n, n] bool, True where column j is an ancestor of (or is) row i."""
        n = len(self.tokens)
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            j = i
            while j >= 0:
                mask[i, j] = True
                j = self.parents[j]
        return mask

    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def step_input(self, cache, root_position: int) -> StepInput:
        """The tree's tokens for a batched forward, its root at `root_position` of `cache`. The
        small tensors are made through numpy, which costs a fraction of torch.tensor's per-call
        overhead."""
        positions = np.asarray(self.depths, dtype=np.int64)
        positions += root_position
        mask = None if self.is_chain() else self.ancestor_mask()
        tokens = torch.from_numpy(np.asarray(self.tokens, dtype=np.int64))
        return StepInput(tokens, torch.from_numpy(positions), Segment(cache, len(self), mask))


class RootInput:
    """A plain step's input (a root alone), one per request: its two one-element tensors are
    made once and rewritten through numpy views, since making them right after a native step,
    with the interpreter's data out of the CPU's caches, cost more than the rest of the step's
    input. The forward reads them only while it runs."""

    def __init__(self):
        self.tokens, self.positions = torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
        self._token, self._position = self.tokens.numpy(), self.positions.numpy()

    def at(self, token: int, position: int, cache) -> StepInput:
        self._token[0], self._position[0] = token, position
        return StepInput(self.tokens, self.positions, Segment(cache, 1))
