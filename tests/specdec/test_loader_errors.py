"""Bad checkpoints give a clear error naming what is wrong."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec import CheckpointError, ConfigError, load_model


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_unsupported_architecture_names_supported_ones(hf_checkpoints, tmp_path):
    d = _copy(hf_checkpoints["qwen3"][0], tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="Qwen3MoeForCausalLM"):
        load_model(d)


def test_missing_and_unexpected_tensors_are_listed(hf_checkpoints, tmp_path):
    d = _copy(hf_checkpoints["qwen3_moe"][0], tmp_path / "m")
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.0.self_attn.q_proj.weight"]
    del tensors["model.layers.2.mlp.experts.3.up_proj.weight"]
    tensors["model.extra.weight"] = torch.zeros(2)
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(CheckpointError) as err:
        load_model(d)
    text = str(err.value)
    assert "missing tensor model.layers.0.self_attn.q_proj.weight" in text
    assert "model.layers.2.mlp.experts.3.up" in text
    assert "unexpected tensor model.extra.weight" in text


def test_shape_disagreeing_with_config(hf_checkpoints, tmp_path):
    d = _copy(hf_checkpoints["qwen2"][0], tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 64
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="shape of model.layers.0.mlp.gate_proj.weight"):
        load_model(d)


def test_sharded_checkpoint(hf_checkpoints, tmp_path):
    src, reference = hf_checkpoints["mixtral"]
    reference.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    ids = torch.randint(0, 97, (1, 7))
    assert torch.allclose(load_model(tmp_path / "sharded").logits(ids), load_model(src).logits(ids))


def test_missing_directory_and_files(tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        load_model(tmp_path / "empty")


def test_a_model_that_will_not_fit_is_refused_before_loading(tiny_models, monkeypatch):
    from specdec import loader

    need = loader.weight_bytes(tiny_models[0], torch.float32)
    half = loader.weight_bytes(tiny_models[0], torch.bfloat16)
    assert need > 0 and abs(half * 2 - need) <= 8
    monkeypatch.setattr(loader, "available_bytes", lambda device: need // 2)
    with pytest.raises(loader.CheckpointError, match="the weights need about .* GiB in torch.float32"):
        loader.load_model(tiny_models[0])
    monkeypatch.setattr(loader, "available_bytes", lambda device: need * 2)
    assert loader.load_model(tiny_models[0]) is not None
