"""Greedy decoding of 64 tokens on a ~20M-parameter Qwen3-MoE: our implementation against transformers' generate.

    python bench/bench_decode.py [--threads 2] [--repeats 5]

Same random weights (written by transformers, loaded by ours), same prompt, same process;
both produce the same tokens (checked). Reports median ms per token and the ratio.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time

import torch

from specdec import Segment, load_model


def hf_model():
    import transformers as tf

    cfg = tf.Qwen3MoeConfig(vocab_size=8192, hidden_size=256, num_hidden_layers=6, num_attention_heads=8,
                            num_key_value_heads=4, head_dim=32, intermediate_size=1024, moe_intermediate_size=512,
                            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=True,
                            max_position_embeddings=2048)
    torch.manual_seed(0)
    return tf.Qwen3MoeForCausalLM(cfg).eval()


@torch.inference_mode()
def ours_greedy(model, prompt, new_tokens):
    cache = model.new_cache(prompt.numel() + new_tokens + 1)
    logits = model(prompt, torch.arange(prompt.numel()), [Segment(cache, prompt.numel())], logits_rows=[prompt.numel() - 1])
    cache.keep_all()
    out = []
    token = int(logits[0].argmax())
    for _ in range(new_tokens):
        out.append(token)
        position = torch.tensor([cache.length])
        logits = model(torch.tensor([token]), position, [Segment(cache, 1)])
        cache.keep_all()
        token = int(logits[0].argmax())
    return out


@torch.inference_mode()
def hf_greedy(model, prompt, new_tokens):
    out = model.generate(prompt[None], max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=0)
    return out[0, prompt.numel():].tolist()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    reference = hf_model()
    with tempfile.TemporaryDirectory() as tmp:
        reference.save_pretrained(tmp)
        ours = load_model(tmp)
    params = sum(p.numel() for p in reference.parameters())
    prompt = torch.randint(0, 8192, (args.prompt,), generator=torch.Generator().manual_seed(1))
    same = ours_greedy(ours, prompt, args.tokens) == hf_greedy(reference, prompt, args.tokens)
    times = {"ours": [], "transformers": []}
    for _ in range(args.repeats):  # interleaved, so drift in machine load hits both
        for name, fn, model in (("ours", ours_greedy, ours), ("transformers", hf_greedy, reference)):
            t = time.perf_counter()
            fn(model, prompt, args.tokens)
            times[name].append((time.perf_counter() - t) * 1000 / args.tokens)
    result = {"params": params, "threads": args.threads, "prompt_tokens": args.prompt, "new_tokens": args.tokens,
              "same_tokens": same, "ms_per_token_median": {k: round(statistics.median(v), 3) for k, v in times.items()}}
    result["speedup"] = round(result["ms_per_token_median"]["transformers"] / result["ms_per_token_median"]["ours"], 2)
    print(json.dumps(result, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
