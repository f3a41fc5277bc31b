"""Peer baselines on the same weights through transformers: generate, prompt lookup, assisted decoding."""

import time

import torch

NAMES = ("hf-ar", "hf-pld", "hf-assist")


class HealingRestriction:
    """A logits processor applying our token-healing constraint (fim.Healing) to the first
    generated tokens, until they spell the healed text."""

    def __init__(self, prompt_length: int, healing):
        self.prompt_length, self.healing = prompt_length, healing

    def __call__(self, input_ids, scores):
        healing = self.healing
        for token in input_ids[0, self.prompt_length :].tolist():
            if healing is None:
                break
            healing = healing.after(token)
        if healing is None:
            return scores
        mask = torch.full_like(scores, float("-inf"))
        mask[:, healing.allowed] = 0
        return scores + mask


class HFBaselines:
    names = NAMES

    def __init__(self, target_dir, draft_dir):
        self.target = _transformers_model(target_dir)
        self.draft = _transformers_model(draft_dir) if draft_dir else None

    def run(self, engine, point, reference: dict) -> dict:
        """Generate as many tokens as `ar` did for this point; timed the same way (whole request)."""
        from transformers import LogitsProcessorList

        prompt = engine.prompt_for(point.prefix, point.suffix, path=point.path)
        ids = torch.tensor([prompt.ids])
        new_tokens = max(1, len(reference["tokens"]) + (reference["stop_reason"] == "eos"))
        processors = LogitsProcessorList([HealingRestriction(ids.shape[1], prompt.healing)])
        eos = sorted(engine.stop_token_ids)
        variants = {"hf-ar": {}, "hf-pld": {"prompt_lookup_num_tokens": 10}}
        if self.draft is not None:
            variants["hf-assist"] = {"assistant_model": self.draft}
        out = {}
        for name, extra in variants.items():
            start = time.perf_counter()
            with torch.inference_mode():
                generated = self.target.generate(ids, max_new_tokens=new_tokens, do_sample=False, eos_token_id=eos,
                                                 pad_token_id=eos[0], logits_processor=processors, **extra)
            ms = (time.perf_counter() - start) * 1000
            tokens = [t for t in generated[0, ids.shape[1]:].tolist() if t not in engine.stop_token_ids]
            tokens = tokens[: len(reference["tokens"])]
            out[name] = {**reference, "tokens": tokens, "ms": ms, "decode_ms": ms, "passes": 0,
                         "generated": len(tokens), "accepted_by_source": {},
                         "text": reference["text"] if tokens == reference["tokens"] else engine.tokenizer.decode(tokens)}
        return out


def _transformers_model(path):
    """A model directory, or a .gguf file (transformers dequantizes it; it needs accelerate)."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    path = Path(path)
    if path.is_file():
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
