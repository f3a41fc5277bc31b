"""`specdec adapt`: a draft distilled on a repository, its card, and who may use it."""

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from specdec import Engine
from specdec.cli import main as cli_main
from specdec.models.adapted import (
    CARD,
    AdaptedDraftMismatch,
    adapted_draft_for,
    repository_draft_dir,
    target_fingerprint,
)
from specdec.training.adapt import AdaptError, AdaptSettings, adapt, changed_since, repository_files, split_files

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A small real repository: this project's own prefix-cache sources."""
    root = tmp_path_factory.mktemp("repo") / "mini"
    shutil.copytree(ROOT / "prefixcache", root / "prefixcache", ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture(scope="module")
def adapted(repo, tiny_models):
    target, draft = tiny_models
    out = repository_draft_dir(repo)
    card = adapt(repo, out, target, draft, AdaptSettings(minutes=0.08, seq_len=64, batch_size=2, progress=False))
    return out, card


def test_split_is_stable_and_holds_files_out(repo):
    files = repository_files(repo)
    adapt_files, held = split_files(files)
    assert held and adapt_files and len(held) + len(adapt_files) == len(files)
    assert {f.path for f in held}.isdisjoint({f.path for f in adapt_files})
    assert [f.path for f in split_files(list(reversed(files)))[1]] == [f.path for f in reversed(held)]


def test_card_and_layout(adapted, tiny_models):
    out, card = adapted
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert json.loads((out / CARD).read_text()) == card
    assert card["target_fingerprint"] == target_fingerprint(tiny_models[0])
    assert card["steps"] > 0 and card["tokens"] > 0 and not card["interrupted"]
    assert 0 <= card["agreement_before"] <= 1 and 0 <= card["agreement_after"] <= 1
    assert card["files"]["held_out"] == len(card["held_out_files"]) > 0


def test_engine_uses_the_repositorys_draft_and_stays_lossless(adapted, repo, tiny_models):
    out, _ = adapted
    engine = Engine.from_pretrained(tiny_models[0], None, repo=repo, adaptive=False)
    assert Path(engine.draft.path).resolve() == out.resolve()
    prefix = (repo / "prefixcache" / "index.py").read_text()[:900]
    ar = engine.complete(prefix, "", strategy="ar", max_tokens=24)
    for strategy in ("draft", "hybrid"):
        assert engine.complete(prefix, "", strategy=strategy, max_tokens=24).tokens == ar.tokens


def test_a_draft_adapted_against_another_target_is_refused(adapted, tmp_path, tiny_models, caplog, capsys):
    out, card = adapted
    foreign = tmp_path / "repo"
    shutil.copytree(out, repository_draft_dir(foreign))
    card_path = repository_draft_dir(foreign) / CARD
    card_path.write_text(json.dumps({**card, "target_fingerprint": "0" * 64}))
    with pytest.raises(AdaptedDraftMismatch, match="adapted against another target"):
        Engine.from_pretrained(tiny_models[0], repository_draft_dir(foreign))
    with caplog.at_level(logging.WARNING, logger="specdec.models.adapted"):
        assert adapted_draft_for(tiny_models[0], repo=foreign) is None
    assert "falling back to the shipped one" in caplog.text
    source = foreign / "a.py"
    source.write_text("x = 1\n")
    code = cli_main(["complete", str(source), "--line", "1", "--col", "5", "--target", str(tiny_models[0]),
                     "--draft", str(repository_draft_dir(foreign))])
    assert code == 2 and "adapted against another target" in capsys.readouterr().err


def test_refresh_counts_changed_files(adapted, repo, tiny_models, capsys):
    _, card = adapted
    target, draft = tiny_models
    assert cli_main(["adapt", str(repo), "--min-changed", "3", "--target", str(target), "--draft", str(draft)]) == 0
    assert "up to date (0 file(s) changed" in capsys.readouterr().out
    files = repository_files(repo)
    assert changed_since(card, files) == 0
    files[0].text += "\n# edited\n"
    assert changed_since(card, files[1:]) == 1 and changed_since(card, files) == 1


def test_cli_refuses_bad_input(tmp_path, capsys):
    assert cli_main(["adapt", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli_main(["adapt", str(tmp_path / "empty"), "--minutes", "0"]) == 2
    assert "--minutes" in capsys.readouterr().err
    with pytest.raises(AdaptError, match="too few"):
        split_files([])


def test_an_eagle3_head_adapts_too(repo, tiny_models, tmp_path):
    from specdec import load_model
    from specdec.training.eagle3 import build_head, head_config, save_head

    target = load_model(tiny_models[0])
    raw = head_config(target.config)
    save_head(build_head(raw, target), raw, tmp_path / "head")
    out = tmp_path / "adapted_head"
    card = adapt(repo, out, tiny_models[0], tmp_path / "head",
                 AdaptSettings(minutes=0.05, seq_len=64, batch_size=2, progress=False))
    assert card["kind"] == "eagle3" and card["steps"] > 0 and (out / "model.safetensors").is_file()
    engine = Engine.from_pretrained(tiny_models[0], out, adaptive=False)
    assert engine.head is not None
    prefix = (repo / "prefixcache" / "files.py").read_text()[:700]
    ar = engine.complete(prefix, "", strategy="ar", max_tokens=16)
    assert engine.complete(prefix, "", strategy="hybrid", max_tokens=16).tokens == ar.tokens
    assert card["feature_tokens"] > 0  # the tiny target has a native step: the head learned on its features


def test_a_head_adapts_on_a_packed_targets_features_without_a_float_target(repo, packed_target_and_head, tmp_path):
    """A GGUF target stays in 8-bit blocks: its features come through the native step's capture
    slot, and the head written is the one agreement was measured on, lossless in the engine."""
    from specdec.models.eagle import read_head_tensors

    file, head_dir = packed_target_and_head
    out = tmp_path / "adapted_head"
    card = adapt(repo, out, file, head_dir, AdaptSettings(minutes=0.1, seq_len=64, batch_size=4, progress=False))
    assert card["kind"] == "eagle3" and card["steps"] > 0 and card["feature_tokens"] >= 64
    assert card["target_fingerprint"] == target_fingerprint(file)
    assert 0 <= card["agreement_before"] <= 1 and 0 <= card["agreement_after"] <= 1
    before, after = read_head_tensors(head_dir), read_head_tensors(out)
    assert before.keys() == after.keys() and torch.equal(before["d2t"], after["d2t"])
    assert not torch.equal(before["fc.weight"], after["fc.weight"])  # trained
    engine = Engine.from_pretrained(file, out, quantize="auto", adaptive=False)
    assert engine.target.packed and engine.head.packed
    prefix = (repo / "prefixcache" / "files.py").read_text()[:400]
    ar = engine.complete(prefix, "", strategy="ar", max_tokens=12, mode="multi")
    assert engine.complete(prefix, "", strategy="hybrid", max_tokens=12, mode="multi").tokens == ar.tokens


def test_adapt_without_models_given_adapts_the_head_of_the_pulled_default(repo, packed_target_and_head, pulled_tiny,
                                                                          tmp_path, capsys):
    """With a real model pulled, `specdec adapt REPO` teaches the head that drafts for it, so
    that the adapted draft fits the target that serves; with no head to adapt it says so."""
    _, head_dir = packed_target_and_head
    home, _, digest = pulled_tiny
    out = tmp_path / "adapted"
    assert cli_main(["adapt", str(repo), "--out", str(out), "--minutes", "0.05"]) == 2
    assert "no EAGLE-3 head to adapt" in capsys.readouterr().err and not out.exists()

    head = shutil.copytree(head_dir, home / "head-tiny")
    (head / "card.json").write_text(json.dumps({"target_fingerprint": digest}))
    assert cli_main(["adapt", str(repo), "--out", str(out), "--minutes", "0.05"]) == 0
    card = json.loads((out / CARD).read_text())
    assert card["kind"] == "eagle3" and card["target_fingerprint"] == digest and card["feature_tokens"] > 0
