"""Speculative sampling follows the target's distribution (chi-square, fixed seed)."""

import torch

from specdec import Engine, Segment, load_model
from specdec.decode.accept import Sampling, target_probs
from tests.helpers import generation

# Upper 0.1% points of the chi-square distribution, by degrees of freedom.
CHI2_999 = {5: 20.52, 10: 29.59, 15: 37.70, 20: 45.31, 25: 52.62, 30: 59.70}


def _held(logits, healing):
    """The logits with token healing's hold applied (fim.Healing, None for none)."""
    if healing is None:
        return logits
    masked = torch.full_like(logits, float("-inf"))
    masked[healing.allowed] = logits[healing.allowed]
    return masked


def _exact_pairs(model, prompt_ids, healing, sampling):
    """{(t1, t2): probability} of the first two tokens under the target."""
    logits = model.logits(torch.tensor([prompt_ids]))[0, -1]
    first = target_probs(_held(logits, healing), sampling)
    pairs = {}
    for t1 in torch.nonzero(first).flatten().tolist():
        after = healing.after(t1) if healing is not None else None
        second = target_probs(_held(model.logits(torch.tensor([prompt_ids + [t1]]))[0, -1], after), sampling)
        for t2 in torch.nonzero(second).flatten().tolist():
            pairs[(t1, t2)] = float(first[t1] * second[t2])
    return pairs


def test_speculative_sampling_matches_target_distribution(tiny_models):
    target = load_model(tiny_models[0])
    engine = Engine(target, target, None, adaptive=False)  # the target as its own draft: many proposals accepted
    engine.draft_min_prob = 0.0
    engine.draft_depth = 2  # only two tokens are sampled
    sampling = Sampling(temperature=1.0, top_k=3)
    prefix = "def add(a, b):\n    return a + b\n\nvalue = add(1, "
    probe = engine.prompts.build(prefix, "")  # the prompt each generation below builds
    exact = _exact_pairs(target, probe.ids, probe.healing, sampling)
    counts, samples, drafted = {}, 1500, 0
    for seed in range(samples):
        g = generation(engine, prefix, "", strategy="draft", max_tokens=2, temperature=1.0, top_k=3, seed=seed,
                              use_prompt_cache=seed > 0)
        engine.scheduler.run_until_done([g])
        pair = tuple(g.committed[len(g.prompt.ids) : len(g.prompt.ids) + 2])
        counts[pair] = counts.get(pair, 0) + 1
        drafted += g.stats["accepted_by_source"]["draft"]
    assert drafted > samples // 4, "speculation was hardly exercised"
    assert set(counts) <= set(exact)
    chi2 = sum((counts.get(k, 0) - samples * p) ** 2 / (samples * p) for k, p in exact.items())
    dof = len(exact) - 1
    assert chi2 < CHI2_999[min(CHI2_999, key=lambda d: abs(d - dof))], (chi2, dof)


def test_seeded_sampling_is_reproducible(tiny_models):
    target = load_model(tiny_models[0])
    engine = Engine(target, load_model(tiny_models[1]), None)
    runs = [engine.complete("x = [", "", strategy="hybrid", temperature=0.8, top_p=0.9, max_tokens=10, seed=7).tokens
            for _ in range(2)]
    assert runs[0] == runs[1]
    segment_check = target(torch.tensor([1, 2]), torch.tensor([0, 1]), [Segment(target.new_cache(), 2)])
    assert segment_check.shape[0] == 2


def test_seeded_sampling_equals_plain_sampling_for_every_strategy(tiny_models):
    """Each position's token comes from the target's distribution at a uniform keyed by (seed,
    position), so speculation changes only the speed: every strategy emits ar's tokens."""
    from tests.helpers import code_prompts

    engine = Engine(load_model(tiny_models[0]), load_model(tiny_models[1]), None, adaptive=False)
    for seed, (_, prefix, suffix) in enumerate(code_prompts(6, seed=11)):
        options = dict(temperature=0.9, top_p=0.95, max_tokens=12, mode="multi", seed=seed)
        reference = engine.complete(prefix, suffix, strategy="ar", **options).tokens
        for strategy in ("draft", "ngram", "hybrid"):
            assert engine.complete(prefix, suffix, strategy=strategy, **options).tokens == reference, (seed, strategy)


def test_ignore_eos_runs_past_the_end_of_generation_losslessly(tiny_models):
    """With ignore_eos a completion the tiny target ends with an end-of-generation token goes on
    to its limit, every strategy writing the same tokens."""
    from tests.helpers import code_prompts

    engine = Engine(load_model(tiny_models[0]), load_model(tiny_models[1]), None, adaptive=False)
    options = dict(max_tokens=120, mode="multi")
    ended = [(p, s, r) for _, p, s in code_prompts(20, seed=4)
             if (r := engine.complete(p, s, strategy="ar", **options)).stats.stop_reason == "eos"]
    assert ended, "the premise: some prompt ends with an end-of-generation token"
    prefix, suffix, plain = ended[0]
    reference = engine.complete(prefix, suffix, strategy="ar", ignore_eos=True, **options)
    assert len(reference.tokens) > len(plain.tokens)
    assert reference.tokens[: len(plain.tokens)] == plain.tokens
    assert not set(reference.tokens) & engine.prompts.stop_ids
    for strategy in ("draft", "hybrid"):
        got = engine.complete(prefix, suffix, strategy=strategy, ignore_eos=True, **options)
        assert got.tokens == reference.tokens, strategy
