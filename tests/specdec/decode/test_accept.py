"""Acceptance: what the target keeps of a tree, on numpy rows as on tensors, with banned tokens."""

import torch

from specdec.decode.accept import Sampling


class _FirstTokenHeld:
    """A healing (fim.Healing's interface) that holds the first token to `allowed`, then lets go."""

    def __init__(self, allowed):
        self.allowed = allowed

    def after(self, token):
        return None


def test_acceptance_reads_a_numpy_view_of_the_logits_as_it_reads_the_tensor():
    """The scheduler hands a CPU forward's logits over as numpy: greedy, restricted (healing)
    and sampled acceptance must choose what they choose on the tensor."""
    from specdec.decode.accept import Uniforms, accept
    from specdec.decode.tree import TokenTree

    generator = torch.Generator().manual_seed(3)
    for trial in range(40):
        tree = TokenTree(5)
        logits = torch.randn(4, 50, generator=generator)
        favourite = [int(row.argmax()) for row in logits]
        child = tree.add_child(0, favourite[0] if trial % 2 else 7, "draft", 0.5)
        tree.add_child(child, favourite[child], "draft", 0.5)
        tree.add_child(0, 11, "trie", 0.3)
        if trial % 4 == 0:  # every row's largest value twice: the first of equals wins
            logits[:, 13] = logits.max(dim=1).values
        held = _FirstTokenHeld(torch.tensor([11, 7, favourite[0]]))
        for sampling, healing in ((Sampling(), None), (Sampling(), held), (Sampling(0.8, 0.9, 20), None)):
            on_tensor = accept(tree, logits, sampling, Uniforms(trial), healing, position=9)
            on_numpy = accept(tree, logits.numpy(), sampling, Uniforms(trial), healing, position=9)
            assert (on_tensor.nodes, on_tensor.bonus) == (on_numpy.nodes, on_numpy.bonus)


def test_banned_tokens_are_never_picked_and_the_rest_is_unchanged():
    """ignore_eos bans tokens: greedy takes the best of the rest, on the tensor and on numpy alike."""
    from specdec.decode.accept import Uniforms, accept
    from specdec.decode.tree import TokenTree

    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(5))
    favourite = int(logits[0].argmax())
    runner_up = int(logits[0].topk(2).indices[1])
    tree = TokenTree(5)
    tree.add_child(0, runner_up, "draft", 0.5)
    for sampling in (Sampling(banned=(favourite,)), Sampling(0.7, 1.0, 0, (favourite,))):
        for rows in (logits, logits.numpy()):
            got = accept(tree, rows, sampling, Uniforms(1), None, position=0)
            assert favourite != (tree.tokens[got.nodes[0]] if got.nodes else got.bonus)
    greedy = accept(tree, logits.numpy(), Sampling(banned=(favourite,)), None)
    assert greedy.nodes == [1]  # the runner-up, drafted, is accepted once the favourite is banned
    assert accept(tree, logits.numpy(), Sampling(), None).bonus == favourite
