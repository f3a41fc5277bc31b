"""The expert-routing bench's analysis on synthetic forwards whose answers are known."""

import random

import numpy as np

from bench.expert_routing import cost_fits, expert_frequencies, neighbour_overlap, woken, woken_by_size


def forward(routes, cached=500, ms=1.0, request="0:ar"):
    """routes: [layers][n][k] expert ids."""
    return {"n": len(routes[0]), "cached": cached, "ms": ms, "ids": routes, "request": request}


def test_repeated_routes_overlap_fully_and_independent_ones_do_not():
    sticky = [forward([[[1, 2]], [[3, 4]]], cached=100 + i) for i in range(20)]
    frequencies = expert_frequencies(sticky, 8)
    assert np.allclose(frequencies.sum(axis=1), 2)
    assert neighbour_overlap(sticky, frequencies)["measured"] == [1.0, 1.0]
    rng = random.Random(0)
    loose = [forward([[rng.sample(range(8), 2)], [rng.sample(range(8), 2)]], cached=100 + i) for i in range(2000)]
    result = neighbour_overlap(loose, expert_frequencies(loose, 8))
    assert result["pairs"] == 1999
    assert np.allclose(result["measured"], result["independent"], atol=0.03)
    assert np.allclose(result["independent"], 0.25, atol=0.01)


def test_steps_of_other_requests_or_positions_are_not_neighbours():
    steps = [forward([[[1, 2]]], cached=100), forward([[[1, 2]]], cached=102), forward([[[1, 2]]], cached=103, request="1:ar")]
    assert neighbour_overlap(steps, expert_frequencies(steps, 8))["pairs"] == 0


def test_woken_counts_distinct_experts_per_layer():
    tree = forward([[[0, 1], [1, 2], [0, 2]], [[5, 6], [5, 6], [5, 6]]])
    assert woken(tree) == 3 + 2
    table = woken_by_size([tree] * 10, expert_frequencies([tree], 8))
    assert table[3]["mean"] == 5 and table[3]["sd"] == 0


def test_cost_fit_recovers_the_price_of_a_woken_expert():
    rng = random.Random(1)
    passes = []
    for _ in range(600):
        n = rng.choice((2, 4, 8))
        routes = [[rng.sample(range(8), 2) for _ in range(n)] for _ in range(4)]
        cached = rng.randrange(200, 1200)
        level = {2: 2.5, 4: 3.4, 8: 5.0}[n]
        passes.append(forward(routes, cached, level + 0.5 * cached / 1000 + 0.05 * woken(forward(routes))
                              + rng.gauss(0, 0.01)))
    fits = cost_fits(passes)
    assert abs(fits["ms_per_woken_expert"] - 0.05) < 0.005
    assert abs(fits["size_and_woken"]["ms_per_1000_cached"] - 0.5) < 0.02
    assert fits["mae_cut_by_knowing_woken"] > 0.5
