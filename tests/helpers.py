"""Tiny real models for engine and server tests: a trained BPE tokenizer with FIM tokens and random weights."""

import socket
import sysconfig
from pathlib import Path

import torch

from specdec.models.config import ModelConfig
from specdec.models.loader import save_model
from specdec.models.model import Transformer
from specdec.training.tokenizer import SPECIAL_TOKENS, train_tokenizer

STDLIB = Path(sysconfig.get_paths()["stdlib"])
CORPUS_FILES = ["json/decoder.py", "json/encoder.py", "textwrap.py", "shlex.py", "fnmatch.py", "glob.py"]


def tiny_config(arch: str, vocab: int, eos: int) -> dict:
    common = {"vocab_size": vocab, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 2048,
              "tie_word_embeddings": False, "eos_token_id": eos, "fim_mode": "spm", "head_dim": 16}
    if arch == "moe":
        return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **common, "hidden_size": 48,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
                "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True}
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **common, "hidden_size": 32,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 48}


def write_random_model(directory: Path, raw: dict, tokenizer, seed: int, scale: float = 0.35) -> Path:
    """Random weights large enough that logits are well separated (greedy ties would be flaky)."""
    model = Transformer(ModelConfig.from_dict(raw))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else torch.randn(p.shape, generator=gen) * scale)
    save_model(model, directory, raw)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def make_tiny_models(root: Path):
    """(target dir, draft dir) sharing one 600-token tokenizer."""
    texts = [(STDLIB / f).read_text() for f in CORPUS_FILES]
    tokenizer = train_tokenizer(texts, vocab_size=600)
    eos = tokenizer.token_to_id(SPECIAL_TOKENS[0])
    target = write_random_model(root / "target", tiny_config("moe", tokenizer.get_vocab_size(), eos), tokenizer, 1)
    draft = write_random_model(root / "draft", tiny_config("dense", tokenizer.get_vocab_size(), eos), tokenizer, 2)
    return target, draft


def generation(engine, prefix: str, suffix: str = "", **options):
    """A Generation not yet submitted, for tests that drive the scheduler step by step."""
    from specdec.decode.generation import Generation
    from specdec.options import CompletionOptions

    return Generation(engine.decode, CompletionOptions(prefix, suffix, **options))


def code_prompts(count: int, seed: int = 0, before: int = 600, after: int = 200):
    """(path, prefix, suffix) cut at random cursor positions of real stdlib files."""
    import random

    rng = random.Random(seed)
    files = [f for f in sorted(STDLIB.glob("*.py")) if 2000 < f.stat().st_size < 60000]
    out = []
    while len(out) < count:
        f = rng.choice(files)
        text = f.read_text(errors="replace")
        cursor = rng.randrange(200, len(text) - 100)
        out.append((f.name, text[max(0, cursor - before) : cursor], text[cursor : cursor + after]))
    return out



def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def typed_along(engine, count: int = 6, seed: int = 31, document: str = "doc.py"):
    """(prefix, suffix) once a user has typed the first 3 characters of the suggestion `engine`
    showed in `document`, for each of `count` code prompts whose suggestion has 8 or more."""
    for _path, prefix, suffix in code_prompts(count, seed=seed, before=500, after=100):
        shown = engine.complete(prefix, suffix, max_tokens=24, mode="multi", document=document)
        if len(shown.text) >= 8:
            yield prefix + shown.text[:3], suffix
