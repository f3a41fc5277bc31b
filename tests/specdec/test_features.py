"""A real (GGUF) target's features for EAGLE-3 training: extracted through the native step, kept
in a resumable store, and a head trained on them as on the live target."""

import pytest
import torch
from gguf import GGMLQuantizationType

from specdec import Engine, Segment, load_model
from specdec.models.eagle import load_eagle3
from specdec.training.eagle3 import (
    TeacherLogits,
    build_head,
    head_config,
    head_loss,
    head_loss_fn,
    save_head,
    store_agreement,
    stored_head_loss,
)
from specdec.training.features import (
    FeatureSettings,
    FeatureStore,
    FeatureStoreError,
    extract,
    open_store_of,
    target_row,
)
from specdec.training.train import TrainSettings, train
from specdec_kernels import cpu_decode
from tests.specdec.models.gguf_files import write_gguf
from tests.specdec.models.test_gguf import tiny_transformers_model
from tests.specdec.tiny_qwen2 import random_rows, tiny_qwen2_gguf

pytestmark = pytest.mark.skipif(cpu_decode.library() is None, reason="no C compiler for the native step")
LENGTH = 24


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    return tiny_qwen2_gguf(tmp_path_factory.mktemp("features"))


@pytest.fixture(scope="module")
def target(gguf_file):
    return load_model(gguf_file)


def _rows(count: int, seed: int = 0) -> list[list[int]]:
    return random_rows(count, LENGTH, seed)


def _settings(target, **changes) -> FeatureSettings:
    capture = build_head(head_config(target.config), target).config.capture_layers(target.config.num_layers)
    base = dict(target="qwen2.gguf:1", capture=tuple(capture), hidden=target.config.hidden_size, seq_len=LENGTH,
                seed=0, mix="psm")
    return FeatureSettings(**{**base, **changes})


def test_a_row_holds_the_captured_inputs_and_the_last_layers_output(target):
    """The three slots are what the eager forward captures; the fourth, through the final norm and
    the LM head, gives the target's own logits."""
    ids = _rows(1)[0]
    capture = _settings(target).capture
    _, features = target_row(target, ids, capture)
    hidden = target.config.hidden_size
    assert features.shape == (LENGTH, 4 * hidden) and features.dtype == torch.bfloat16
    logits = target.logits(torch.tensor([ids[:-1]]))[0]
    native, target.native_step = target.native_step, None
    try:
        target.capture_layers = capture
        n = len(ids) - 1
        eager = target.run(torch.tensor(ids[:-1]), torch.arange(n), [Segment(target.new_cache(n), n)]).captured
    finally:
        target.native_step, target.capture_layers = native, ()
    assert torch.allclose(features[:, : 3 * hidden].float(), eager, atol=2e-2, rtol=1e-2)
    final = features[:, 3 * hidden :].float()
    rebuilt = target.model.norm(final) @ target.lm_head.weight.T
    assert (rebuilt - logits).abs().max() <= 2e-2 * logits.abs().max()
    assert (rebuilt.argmax(-1) == logits.argmax(-1)).float().mean() >= 0.9


def test_the_store_resumes_whole_shards_and_refuses_other_settings(target, tmp_path):
    rows = _rows(40)
    store = FeatureStore.open(tmp_path / "store", _settings(target))
    assert extract(target, rows.__getitem__, store, 10)  # rounded up to whole shards
    assert store.rows == 16 and len(store.shards) == 1
    first = (tmp_path / "store" / store.shards[0]).read_bytes()
    (tmp_path / "store" / ".shard-00001.safetensors.partial").write_bytes(b"a killed run's half shard")
    again = FeatureStore.open(tmp_path / "store", _settings(target))
    assert extract(target, rows.__getitem__, again, 32) and again.rows == 32
    assert (tmp_path / "store" / again.shards[0]).read_bytes() == first  # what was written stays
    assert torch.equal(FeatureStore.open(tmp_path / "store").row_ids(20), torch.tensor(rows[20]))
    with pytest.raises(FeatureStoreError, match="other settings"):
        FeatureStore.open(tmp_path / "store", _settings(target, seq_len=LENGTH * 2))
    with pytest.raises(FeatureStoreError, match="no feature store"):
        FeatureStore.open(tmp_path / "elsewhere")
    other = tmp_path / "other.gguf"
    other.write_bytes(b"another target")
    with pytest.raises(FeatureStoreError, match="holds the features of qwen2.gguf:1, not of other.gguf:14"):
        open_store_of(tmp_path / "store", other)


@pytest.mark.parametrize("bf16", [False, True])
def test_a_head_trains_on_stored_features_as_on_the_live_target(target, tmp_path, bf16):
    """Also with its products in bfloat16 (autocast): the weights stay float32 and it learns as well."""
    store = FeatureStore.open(tmp_path / "store", _settings(target))
    extract(target, _rows(16).__getitem__, store, 16)
    raw = head_config(target.config, draft_vocab=target.config.vocab_size)  # every token: the live loss's terms
    head = build_head(raw, target)
    head.d2t.zero_()
    teacher = TeacherLogits(target, head)
    batch = store.batch(0, 2)
    stored, (agree0, _) = stored_head_loss(head, teacher, batch)
    live, (live0, _) = head_loss(head, target, batch.ids)
    assert abs(stored.item() - live.item()) <= 0.02 * live.item()
    assert abs(float(agree0) - float(live0)) <= 0.1
    settings = TrainSettings(tokens=30 * 2 * LENGTH, batch_size=2, seq_len=LENGTH, lr=3e-3, warmup_steps=2, bf16=bf16)
    assert train(head, lambda step: store.batch(step % 4, 2), settings, tmp_path / "head",
                 loss_fn=head_loss_fn(None, stored=teacher))
    assert stored_head_loss(head, teacher, batch)[0].item() < 0.8 * stored.item()
    assert all(p.dtype == torch.float32 for p in head.parameters())


def test_agreement_on_a_store_is_the_live_agreement_against_the_whole_vocabulary(target, tmp_path):
    store = FeatureStore.open(tmp_path / "store", _settings(target))
    extract(target, _rows(16, seed=5).__getitem__, store, 16)
    whole = build_head(head_config(target.config, draft_vocab=target.config.vocab_size), target, seed=2)
    whole.d2t.zero_()
    measured = store_agreement(whole, target, store, rows=2)
    _, (live0, live1) = head_loss(whole, target, store.batch_of([0, 1]).ids)
    assert measured["tokens"] == 2 * (LENGTH - 2) and measured["argmax_in_draft_vocabulary"] == 1.0
    assert abs(measured["step0"] - float(live0)) <= 0.05 and abs(measured["step1"] - float(live1)) <= 0.05
    narrow = build_head(head_config(target.config, draft_vocab=16), target, seed=2)
    narrow.d2t.copy_(torch.arange(16) * 3)  # target ids 0, 4, 8, ...: most argmaxes lie outside
    small = store_agreement(narrow, target, store, rows=2)
    assert small["step0"] <= small["argmax_in_draft_vocabulary"] < 1.0


def test_a_head_for_a_packed_target_takes_its_embedding_from_the_file_and_drafts_losslessly(gguf_file, target,
                                                                                              tmp_path):
    packed = load_model(gguf_file, packed=True)
    raw = head_config(packed.config, draft_vocab=64)
    save_head(build_head(raw, packed), raw, tmp_path / "head")
    head = load_eagle3(tmp_path / "head", packed)
    every = torch.arange(packed.config.vocab_size)
    assert head.packed and torch.equal(head.embed_tokens(every), target.model.embed_tokens.weight)  # the file's
    engine = Engine(packed, head=head, adaptive=False, warm_up=False)
    prompt = "abc abc\nabc ab"
    reference = engine.complete(prompt, "", strategy="ar", max_tokens=8, mode="multi").tokens
    assert engine.complete(prompt, "", strategy="draft", max_tokens=8, mode="multi").tokens == reference


def test_the_cli_trains_measures_and_exports_a_head_on_stored_features(gguf_file, target, tmp_path, capsys, caplog):
    import json
    import logging
    from dataclasses import replace

    from specdec.training.__main__ import main
    from specdec.training.features import target_identity

    settings = replace(_settings(target), target=target_identity(gguf_file))
    store = FeatureStore.open(tmp_path / "runs" / "features", settings)
    extract(target, _rows(16).__getitem__, store, 16)
    common = ["--teacher", str(gguf_file), "--runs", str(tmp_path / "runs"), "--name", "head-q", "--threads", "1"]
    caplog.set_level(logging.INFO, logger="specdec.training")
    assert main(["head", *common, "--features", str(store.root), "--tokens", str(4 * 2 * LENGTH), "--batch-size", "2",
                 "--draft-vocab", "64"]) == 0
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "step 4/4" in r.getMessage()]
    assert logged and " agreement " in logged[0] and " loss " not in logged[0]  # a head's log names what rises
    capsys.readouterr()
    assert main(["agreement", *common, "--features", str(store.root), "--rows", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == 2 * (LENGTH - 2) and report["train_steps"] == 4
    assert 0 <= report["step0"] <= report["argmax_in_draft_vocabulary"] <= 1
    assert main(["export-head", *common, "--out", str(tmp_path / "head"), "--features", str(store.root),
                 "--rows", "2"]) == 0
    head = load_eagle3(tmp_path / "head", load_model(gguf_file, packed=True))
    assert head.config.draft_vocab_size == 64 and head.packed
    card = json.loads((tmp_path / "head" / "card.json").read_text())
    assert card["target"] == target_identity(gguf_file) and card["train_steps"] == 4 and card["draft_vocab"] == 64
    assert card["agreement"]["step0"] == report["step0"] and card["agreement"]["step1"] == report["step1"]
    with pytest.raises(SystemExit, match="no head checkpoint"):
        main(["agreement", *common[:-4], "--name", "absent", "--features", str(store.root)])
    # a later run starts from the exported head (one step at learning rate 0 keeps what it loaded)
    from safetensors.torch import load_file

    from specdec.training.train import checkpoint_state

    more = [*common[:-3], "head-q2", "--threads", "1", "--features", str(store.root), "--batch-size", "2",
            "--draft-vocab", "64"]
    assert main(["head", *more, "--init-from", str(tmp_path / "head"), "--tokens", str(2 * LENGTH), "--lr", "0"]) == 0
    started = checkpoint_state(tmp_path / "runs" / "head-q2")["model"]
    exported = load_file(str(tmp_path / "head" / "model.safetensors"))
    assert exported.keys() - {"t2d"} <= started.keys() and "fc.weight" in exported
    for name in exported.keys() - {"t2d"}:
        assert torch.equal(started[name].to(exported[name].dtype), exported[name]), name
    # its card counts the training it started from
    assert main(["export-head", *more[:-6], "--out", str(tmp_path / "head2")]) == 0
    continued = json.loads((tmp_path / "head2" / "card.json").read_text())
    assert continued["init_from"]["run"] == "head-q" and continued["init_from"]["train_tokens"] == card["train_tokens"]
    assert continued["total"]["train_tokens"] == card["train_tokens"] + continued["train_tokens"]
    assert "init_from" not in card
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "model.safetensors").write_bytes((tmp_path / "head" / "model.safetensors").read_bytes())
    with pytest.raises(SystemExit, match="not a head of this shape"):
        main(["head", *more[:-1], "32", "--name", "head-q3", "--init-from", str(tmp_path / "other"), "--tokens", "1"])


def test_a_gguf_draft_of_the_same_family_is_packed_as_the_target_and_drafts_losslessly(gguf_file, tmp_path):
    """The family's smaller model as the draft of a GGUF target: packed by the same --quantize
    rule, so that its steps run on the native path, and the output stays the target's."""
    model = tiny_transformers_model("qwen2")
    model.save_pretrained(tmp_path / "hf")  # which names its architecture in its config
    draft_file = write_gguf(tmp_path / "draft.gguf", model, GGMLQuantizationType.Q4_0)
    engine = Engine.from_pretrained(target=gguf_file, draft=draft_file, quantize="auto", adaptive=False,
                                    warm_up=False)
    assert engine.draft.packed is not None and engine.target.packed is not None
    prompt = "abc abc\nabc ab"
    reference = engine.complete(prompt, "", strategy="ar", max_tokens=12, mode="multi")
    drafted = engine.complete(prompt, "", strategy="draft", max_tokens=12, mode="multi")
    assert drafted.tokens == reference.tokens
    assert drafted.stats.accepted_by_source["draft"] > 0  # a Q4_0 copy of the target mostly agrees
