"""Tiny GGUF files written with the `gguf` package's writer, in llama.cpp's layout, from transformers models."""

from pathlib import Path

import numpy as np
import torch

from specdec.prompt.detokenize import _byte_alphabet

# transformers name part -> llama.cpp's, as its converter writes them
BLOCK_PARTS = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight",
}
GGUF_ARCH = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
             "Qwen2MoeForCausalLM": "qwen2moe", "Qwen3MoeForCausalLM": "qwen3moe"}
FIM = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|endoftext|>"]


def byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes, the alphabet of byte-level BPE vocabularies."""
    spelled = _byte_alphabet()
    return [spelled[b] for b in range(256)]


def tiny_vocabulary(size: int) -> tuple[list, list, list]:
    """(tokens, types, merges) of `size` (at least 260): the 256 bytes, merged pairs of letters, and
    the FIM tokens, typed control, last."""
    alphabet = byte_alphabet()
    letters = [alphabet[ord(c)] for c in "abcdefghij "]
    merges = [f"{a} {b}" for a in letters for b in letters][: size - len(alphabet) - len(FIM)]
    tokens = alphabet + [m.replace(" ", "") for m in merges] + FIM
    assert len(tokens) == size, (len(tokens), size)
    return tokens, [1] * (size - len(FIM)) + [3] * len(FIM), merges


def write_gguf(path: Path, model, quantization=None) -> Path:
    """The model's weights (F32, or `quantization` for 2-D weights) and config as llama.cpp writes them."""
    import gguf

    cfg = model.config
    arch = GGUF_ARCH[cfg.architectures[0]]
    writer = gguf.GGUFWriter(str(path), arch)
    _write_metadata(writer, cfg, arch)
    for name, tensor in _llama_cpp_tensors(model, cfg, arch):
        values = tensor.detach().float().numpy()
        if quantization is not None and values.ndim == 2 and values.shape[-1] % 32 == 0:
            writer.add_tensor(name, gguf.quants.quantize(values, quantization), raw_dtype=quantization)
        else:
            writer.add_tensor(name, np.ascontiguousarray(values))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_metadata(writer, cfg, arch: str) -> None:
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    if arch.endswith("moe"):
        writer.add_expert_count(cfg.num_experts)
        writer.add_expert_used_count(cfg.num_experts_per_tok)
        writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        if arch == "qwen2moe":
            writer.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    tokens, types, merges = tiny_vocabulary(cfg.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(len(tokens) - 1)


def _llama_cpp_tensors(model, cfg, arch: str):
    state = model.state_dict()
    yield "token_embd.weight", state["model.embed_tokens.weight"]
    yield "output_norm.weight", state["model.norm.weight"]
    if not cfg.tie_word_embeddings:
        yield "output.weight", state["lm_head.weight"]
    for layer in range(cfg.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        for name, tensor in state.items():
            if not name.startswith(prefix):
                continue
            part = name[len(prefix):]
            if part == "mlp.experts.gate_up_proj":  # [E, 2I, H], gate rows first
                gate, up = tensor.chunk(2, dim=1)
                yield f"blk.{layer}.ffn_gate_exps.weight", gate
                yield f"blk.{layer}.ffn_up_exps.weight", up
                continue
            if part == "mlp.shared_expert_gate.weight":
                tensor = tensor.reshape(-1)
            if arch == "llama" and part.startswith(("self_attn.q_proj", "self_attn.k_proj")):
                heads = cfg.num_attention_heads if "q_proj" in part else cfg.num_key_value_heads
                tensor = _permute_rotary(tensor, heads)
            yield f"blk.{layer}.{BLOCK_PARTS[part]}", tensor


def _permute_rotary(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter: each head's rotary halves interleaved as pairs."""
    rows, rest = tensor.shape[0], tensor.shape[1:]
    return tensor.reshape(heads, 2, rows // heads // 2, *rest).transpose(1, 2).reshape(rows, *rest)
