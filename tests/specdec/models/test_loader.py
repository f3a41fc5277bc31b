"""Bad checkpoints give a clear error naming what is wrong."""

import json
import os
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
    from specdec.models import loader

    need = loader.weight_bytes(tiny_models[0], torch.float32)
    half = loader.weight_bytes(tiny_models[0], torch.bfloat16)
    assert need > 0 and abs(half * 2 - need) <= 8
    monkeypatch.setattr(loader, "available_bytes", lambda device: need // 2)
    with pytest.raises(loader.CheckpointError, match="the weights need about .* GiB in torch.float32"):
        loader.load_model(tiny_models[0])
    monkeypatch.setattr(loader, "available_bytes", lambda device: need * 2)
    assert loader.load_model(tiny_models[0]) is not None


_PEAK_OF_A_LOAD = r"""
import json, sys, threading, time
from specdec import load_model

def anon_kb():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssAnon:"))

load_model(sys.argv[2])  # the lazy imports of a load, outside the figure
base, peak, done = anon_kb(), [0], threading.Event()

def sample():
    while not done.is_set():
        peak[0] = max(peak[0], anon_kb())
        time.sleep(0.001)

thread = threading.Thread(target=sample)
thread.start()
model = load_model(sys.argv[1])
done.set()
thread.join()
weights = sum(p.numel() * p.element_size() for p in model.state_dict().values())
print(json.dumps({"peak": (max(peak[0], anon_kb()) - base) * 1024 / weights}))
"""


def test_a_load_holds_no_second_copy_of_the_weights(tiny_models, tmp_path):
    """On the CPU the loader rewrites the widening weights input-major; each checkpoint copy
    must be freed as it is replaced, not held to the end of the load (this checkpoint then
    peaked at 1.6x the weights, and about 1.0x once freed)."""
    import subprocess
    import sys

    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    # 12 layers, so that the one layer of experts a load stacks at a time is a small share of the figure.
    config = Qwen3MoeConfig(vocab_size=512, hidden_size=128, intermediate_size=128, moe_intermediate_size=512,
                            num_hidden_layers=12, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                            num_experts=8, num_experts_per_tok=2)
    Qwen3MoeForCausalLM(config).save_pretrained(tmp_path / "m", max_shard_size="30MB")  # ~75 MB of fp32
    # A fixed mmap threshold: freed large blocks go back to the system at once, so RssAnon is
    # what the load holds, not what glibc's heap kept after the warm-up's frees.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    out = subprocess.run([sys.executable, "-c", _PEAK_OF_A_LOAD, str(tmp_path / "m"), str(tiny_models[0])],
                         capture_output=True, text=True, check=True, env=env)
    peak = json.loads(out.stdout.splitlines()[-1])["peak"]
    assert peak < 1.3, peak
