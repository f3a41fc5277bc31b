"""A small dense draft of the target's tokenizer: built from the target's own layers, distilled on
stored features, saved and loaded (packed like its target), and drafting losslessly."""

import json

import pytest
import torch

from specdec import Engine, Segment, load_model
from specdec.models.config import ConfigError
from specdec.models.dense_draft import is_dense_draft, load_dense_draft
from specdec.training.dense_draft import build_dense_draft, dense_draft_config, dense_draft_loss, save_dense_draft
from specdec.training.eagle3 import TeacherLogits, frequent_tokens_d2t
from specdec.training.features import FeatureSettings, FeatureStore, extract, target_identity
from specdec_kernels import cpu_decode
from tests.specdec.tiny_qwen2 import random_rows, tiny_qwen2_gguf

pytestmark = pytest.mark.skipif(cpu_decode.library() is None, reason="no C compiler for the native step")
LENGTH = 24


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    return tiny_qwen2_gguf(tmp_path_factory.mktemp("dense"))


@pytest.fixture(scope="module")
def target(gguf_file):
    return load_model(gguf_file)


def _rows(count: int, seed: int = 0) -> list[list[int]]:
    return random_rows(count, LENGTH, seed)


def _store(target, gguf_file, root):
    settings = FeatureSettings(target=target_identity(gguf_file), capture=(0, 1, 1), hidden=target.config.hidden_size,
                               seq_len=LENGTH, seed=0, mix="psm")
    store = FeatureStore.open(root, settings)
    extract(target, _rows(16).__getitem__, store, 16)
    return store


def _every_token(target):
    return torch.zeros(target.config.vocab_size, dtype=torch.long)  # d2t of the whole vocabulary


def test_built_of_all_the_targets_layers_it_is_the_target(target):
    """Its layers, final norm and LM-head rows are the target's, and its input the target's embedding."""
    raw = dense_draft_config(target.config, target.config.vocab_size, init_layers=range(target.config.num_layers))
    draft = build_dense_draft(raw, target, _every_token(target)).eval()
    ids = torch.tensor(_rows(1)[0])
    n = len(ids)
    logits = draft(ids, torch.arange(n), [Segment(draft.new_cache(n), n)])
    assert torch.allclose(logits, target.logits(ids[None])[0], atol=1e-4, rtol=1e-4)


def test_outside_its_vocabulary_the_logits_are_minus_infinity(target):
    raw = dense_draft_config(target.config, 16)
    d2t = torch.arange(16) * 2  # target ids 0, 3, 6, ...
    draft = build_dense_draft(raw, target, d2t).eval()
    assert raw["init_layers"] == [0, target.config.num_layers - 1]
    logits = draft(torch.tensor([5, 6, 7]), torch.arange(3), [Segment(draft.new_cache(3), 3)], logits_rows=[2])
    kept = torch.arange(16) * 3
    assert logits.shape == (1, target.config.vocab_size) and torch.isfinite(logits[0, kept]).all()
    outside = torch.ones(target.config.vocab_size, dtype=torch.bool)
    outside[kept] = False
    assert torch.isneginf(logits[0, outside]).all()


def test_distillation_on_stored_features_raises_its_agreement(target, gguf_file, tmp_path):
    store = _store(target, gguf_file, tmp_path / "store")
    raw = dense_draft_config(target.config, 64, init_layers=(-1,))  # the tiny target's two layers would be it
    d2t = frequent_tokens_d2t((store.row_ids(i) for i in range(store.rows)), target.config.vocab_size, 64)
    draft = build_dense_draft(raw, target, d2t)
    teacher = TeacherLogits(target, draft)
    batch = store.batch_of(list(range(16)))
    before, agree_before = dense_draft_loss(draft, teacher, batch)
    optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=3e-3)
    for step in range(30):
        loss, _ = dense_draft_loss(draft, teacher, store.batch(step, 4))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after, agree_after = dense_draft_loss(draft, teacher, batch)
    assert after.item() < 0.7 * before.item() and float(agree_after) > float(agree_before)
    assert not draft.body.model.embed_tokens.weight.requires_grad  # the target's, as served


def test_saved_and_loaded_for_a_packed_target_it_drafts_losslessly(target, gguf_file, tmp_path):
    raw = dense_draft_config(target.config, 128)
    draft = build_dense_draft(raw, target, frequent_tokens_d2t([list(range(128))], target.config.vocab_size, 128))
    save_dense_draft(draft, tmp_path / "dense")
    assert is_dense_draft(tmp_path / "dense") and not is_dense_draft(tmp_path)
    packed_target = load_model(gguf_file, packed=True)
    loaded = load_dense_draft(tmp_path / "dense", packed_target)
    ids = torch.tensor(_rows(1, seed=3)[0])
    n = len(ids)
    float_logits = load_dense_draft(tmp_path / "dense", target)(ids, torch.arange(n), [Segment(draft.new_cache(n), n)])
    packed_logits = loaded(ids, torch.arange(n), [Segment(loaded.new_cache(n), n)])
    kept = draft.kept()
    assert (packed_logits[:, kept].argmax(-1) == float_logits[:, kept].argmax(-1)).float().mean() >= 0.9
    engine = Engine(packed_target, loaded, adaptive=False, warm_up=False)
    prompt = "abc abc\nabc ab"
    reference = engine.complete(prompt, "", strategy="ar", max_tokens=10, mode="multi").tokens
    assert engine.complete(prompt, "", strategy="draft", max_tokens=10, mode="multi").tokens == reference
    served = Engine.from_pretrained(target=str(gguf_file), draft=str(tmp_path / "dense"), warm_up=False)
    assert served.decode.draft is not None and served.decode.head is None


def test_a_draft_of_another_target_is_refused(target, tmp_path):
    raw = dense_draft_config(target.config, 16)
    save_dense_draft(build_dense_draft(raw, target, _every_token(target)[:16]), tmp_path / "dense")
    config = json.loads((tmp_path / "dense" / "config.json").read_text())
    (tmp_path / "dense" / "config.json").write_text(json.dumps({**config, "hidden_size": 128}))
    with pytest.raises(ConfigError, match="cannot draft for a target"):
        load_dense_draft(tmp_path / "dense", target)


def test_the_cli_trains_and_exports_a_dense_draft_with_its_card(target, gguf_file, tmp_path):
    from specdec.training.__main__ import main

    store = _store(target, gguf_file, tmp_path / "runs" / "features")
    common = ["--teacher", str(gguf_file), "--runs", str(tmp_path / "runs"), "--name", "dense", "--threads", "1"]
    assert main(["dense-draft", *common, "--features", str(store.root), "--tokens", str(4 * 2 * LENGTH),
                 "--batch-size", "2", "--draft-vocab", "64"]) == 0
    assert main(["export-dense-draft", *common, "--out", str(tmp_path / "out"), "--features", str(store.root),
                 "--rows", "2"]) == 0
    card = json.loads((tmp_path / "out" / "card.json").read_text())
    assert card["kind"] == "dense-draft" and card["train_steps"] == 4 and card["draft_vocab"] == 64
    assert card["agreement"]["tokens"] == 2 * LENGTH and 0 <= card["agreement"]["step0"] <= 1
    assert load_dense_draft(tmp_path / "out", target).config.num_layers == 2
    with pytest.raises(SystemExit, match="--init-layers"):
        main(["dense-draft", *common[:-3], "other", "--features", str(store.root), "--init-layers", "first,last"])
    with pytest.raises(SystemExit, match="no dense-draft checkpoint"):
        main(["export-dense-draft", *common[:-3], "absent", "--out", str(tmp_path / "absent")])
