"""The embedded default models: complete, loadable by transformers, completing real code."""

import math

import pytest
import torch

from prefixcache import grammars
from specdec import STRATEGIES, Engine, default_model_dir, load_model
from tests.helpers import STDLIB, code_prompts

DEFAULTS = default_model_dir()


@pytest.fixture(scope="module")
def engine():
    return Engine.from_pretrained()


def test_layout_and_size():
    total = 0
    for name in ("target", "draft"):
        for file in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
            path = DEFAULTS / name / file
            assert path.exists(), path
            total += path.stat().st_size
    total += sum(f.stat().st_size for f in (DEFAULTS / "head").iterdir())
    assert total <= 60e6


def test_target_is_moe_and_draft_is_cheaper(engine):
    from specdec.training.recipe import active_params

    target, draft = engine.target.config, engine.draft.config
    assert target.architecture == "Qwen3MoeForCausalLM" and target.num_experts >= 8 and target.top_k == 2
    assert draft.architecture in ("Qwen3ForCausalLM", "LlamaForCausalLM")
    # The draft's budget is its step time (a fraction of a target step, bench/step_cost.py);
    # multiply-adds are the part of it a test can check without timing.
    assert active_params(draft) * 3 <= active_params(target)


@pytest.mark.parametrize("name", ["target", "draft"])
def test_transformers_loads_the_defaults(name):
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoModelForCausalLM.from_pretrained(DEFAULTS / name, dtype=torch.float32).eval()
    ours = load_model(DEFAULTS / name)
    ids = torch.randint(0, ours.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference(ids).logits
    assert ((ours.logits(ids) - expected).abs().max() / expected.abs().max()) < 1e-4


def _errors(tree) -> int:
    count, stack = 0, [tree.root_node]
    while stack:
        node = stack.pop()
        count += node.type == "ERROR" or node.is_missing
        stack.extend(node.children)
    return count


def _line_start_cases(count: int, seed: int):
    """(prefix up to a statement's indentation, suffix after that line) in real stdlib files."""
    import random

    rng = random.Random(seed)
    files = [f for f in sorted(STDLIB.glob("*.py")) if 3000 < f.stat().st_size < 30000]
    cases = []
    while len(cases) < count:
        text = rng.choice(files).read_text()
        lines = text.split("\n")
        row = rng.randrange(len(lines))
        line = lines[row]
        stripped = line.strip()
        if not line.startswith("    ") or not stripped or stripped.startswith(("#", '"', "'")) or stripped.endswith((":", "\\", ",", "(")):
            continue
        start = sum(len(x) + 1 for x in lines[:row])
        indent = len(line) - len(line.lstrip())
        cases.append((text[: start + indent], text[start + len(line) :]))
    return cases


@pytest.mark.parametrize("fim_mode", ["spm", "psm"])
def test_completions_splice_into_parsable_files(engine, fim_mode):
    parser = grammars.parser("python")
    engine.prompts.fim_mode = fim_mode
    clean = 0
    cases = _line_start_cases(12, seed=5)
    try:
        for prefix, suffix in cases:
            # A statement removed from a real file: the completion fills its line (or block).
            result = engine.complete(prefix, suffix, strategy="hybrid", mode="auto", max_tokens=48)
            before = _errors(parser.parse((prefix + suffix).encode()))
            after = _errors(parser.parse((prefix + result.text + suffix).encode()))
            clean += after <= before
    finally:
        engine.prompts.fim_mode = "spm"
    assert clean >= len(cases) * 0.5, f"{clean} of {len(cases)} splices parse without new errors"


def test_default_models_are_lossless(engine):
    with_head = Engine.from_pretrained(draft=DEFAULTS / "head", adaptive=False)  # speculate at every step
    with_draft = Engine(engine.target, engine.draft, None, adaptive=False)
    for _path, prefix, suffix in code_prompts(8, seed=11, before=800, after=200):
        ref = with_head.complete(prefix, suffix, strategy="ar", max_tokens=24, mode="multi")
        for strategy in STRATEGIES:
            for speculating in (with_head, with_draft):
                got = speculating.complete(prefix, suffix, strategy=strategy, max_tokens=24, mode="multi")
                assert got.tokens == ref.tokens


def test_forced_speculation_drafts_whatever_a_draft_step_costs(engine):
    """--always-speculate measures acceptance apart from the hardware: a draft as slow as the
    target would draft about one token per pass if the cost ratio still set its floor."""
    forced = Engine(engine.target, engine.draft, None, adaptive=False)
    forced.draft_min_prob = 0.5  # the floor the adaptive engine would take from such a draft
    prompts = code_prompts(4, seed=14, before=600, after=100)
    nodes = passes = 0
    for _path, prefix, suffix in prompts:
        stats = forced.complete(prefix, suffix, strategy="draft", max_tokens=24, mode="multi").stats
        nodes, passes = nodes + stats["tree_nodes"], passes + stats["target_passes"]
    assert nodes / passes >= 4


def test_keystroke_follow_up_prefills_few_tokens(engine):
    _path, prefix, suffix = code_prompts(1, seed=12, before=1500, after=300)[0]
    engine.complete(prefix, suffix, max_tokens=8)
    follow = engine.complete(prefix + "x", suffix, max_tokens=8)
    assert follow.stats["prefill_tokens"] <= 8 and follow.stats["cached_tokens"] > 100


def test_adaptive_engine_falls_back_to_plain_decoding_when_speculation_is_slower(engine):
    for _path, prefix, suffix in code_prompts(4, seed=13, before=600, after=100):
        engine.complete(prefix, suffix, strategy="draft", max_tokens=24, mode="multi")
    policy = engine.policies.prior
    speeds = policy.step_speed["draft"]
    assert set(speeds) == {"spec", "plain"} and min(speeds.values()) > 0
    decisions, interval = [], policy.explore_interval("draft")
    gap = max(speeds.values()) / min(speeds.values()) - 1
    assert interval == max(policy.EXPLORE_EVERY, math.ceil(gap / policy.EXPLORE_COST))
    for _ in range(2 * interval):  # steps that do not move the estimates
        decisions.append(policy.should_speculate("draft"))
        kind = "spec" if decisions[-1] else "plain"
        policy.record_step("draft", decisions[-1], speeds[kind], 1)
    assert decisions.count(speeds["spec"] < speeds["plain"]) == 2 * interval - 2


def test_the_further_apart_the_step_speeds_the_rarer_the_exploration():
    from specdec.decode.policy import SpeculationPolicy

    policy = SpeculationPolicy()
    policy.step_speed["draft"] = {"spec": 4.08, "plain": 4.0}  # 2% apart: the floor of 8
    assert policy.explore_interval("draft") == 8
    policy.step_speed["draft"] = {"spec": 5.0, "plain": 4.0}  # 25% apart: 0.5% of the time at most
    assert policy.explore_interval("draft") == 50
    policy.step_speed["draft"] = {"spec": 8.0, "plain": 4.0}  # twice as slow: 0.5% of the time at most
    assert policy.explore_interval("draft") == 200
    policy.step_speed["draft"] = {"spec": 2.0, "plain": 4.0}  # speculation faster: plain steps explored as rarely
    assert policy.explore_interval("draft") == 200


def test_exploration_keeps_its_interval_while_the_measured_speeds_move():
    """Measured speeds move at every step, and with them the interval: explorations must still
    come about one per interval."""
    import random

    from specdec.decode.policy import SpeculationPolicy

    policy, rng = SpeculationPolicy(), random.Random(2)
    for _ in range(policy.MIN_SAMPLES):
        policy.record_step("draft", True, 3.0, 1)
        policy.record_step("draft", False, 1.5, 1)
    explored, steps = 0, 4000
    for _ in range(steps):
        speculate = policy.should_speculate("draft")
        explored += speculate
        policy.record_step("draft", speculate, (3.0 if speculate else 1.5) * rng.uniform(0.9, 1.1), 1)
    interval = policy.explore_interval("draft")  # about 200: twice as slow, 0.5% of the time
    assert 150 < interval < 260
    assert steps / 260 - 1 <= explored <= steps / 150 + 1


def test_one_stalled_step_does_not_reverse_the_decision():
    from specdec.decode.policy import SpeculationPolicy

    policy = SpeculationPolicy()
    for _ in range(policy.MIN_SAMPLES):
        policy.record_step("draft", True, 2.6, 1)
        policy.record_step("draft", False, 1.3, 1)
    policy.record_step("draft", False, 40.0, 1)  # a 40 ms plain step: a pause, not the speed
    assert policy.step_speed["draft"]["plain"] < 1.3 * 1.3 and not policy.should_speculate("draft")
    for _ in range(30):  # a lasting change still moves it
        policy.record_step("draft", False, 6.0, 1)
    assert policy.step_speed["draft"]["plain"] > 2.6
