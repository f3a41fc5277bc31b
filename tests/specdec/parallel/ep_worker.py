"""Run under torchrun by test_expert_parallel.py: one engine over expert-parallel ranks.

argv: TARGET DRAFT OUT MODE [STATS]; MODE "strategies" writes every strategy's tokens and the
target's logits on a fixed input to OUT (rank 0); MODE "die" makes rank 1 kill itself after a
few forwards ("hang": stops itself), to see the others stop.
"""

import json
import os
import signal
import sys

import torch

from specdec import Engine
from specdec.parallel import expert_parallel

PROMPT = "def total(values):\n    result = 0\n    for value in values:\n        result += value\n    return result\n\n\ndef mean(values):\n    "


def main() -> int:
    target, draft, out, mode = sys.argv[1:5]
    stats = sys.argv[5] if len(sys.argv) > 5 else None
    channel, model = expert_parallel.start(target, stats)
    if channel.rank != 0:
        if mode in ("die", "hang"):
            plain = model.forward
            calls = [0]

            def dying(*args, **kwargs):
                calls[0] += 1
                if calls[0] == 5:
                    os.kill(os.getpid(), signal.SIGKILL if mode == "die" else signal.SIGSTOP)
                return plain(*args, **kwargs)
            model.forward = dying
        return expert_parallel.run_follower(model, channel)
    try:
        engine = Engine.from_pretrained(target, draft, adaptive=False, target_model=model)
        results = {s: engine.complete(PROMPT, "", strategy=s, max_tokens=24).tokens
                   for s in ("ar", "draft", "ngram", "trie", "hybrid")}
        if mode in ("die", "hang"):
            for _ in range(200):
                engine.complete(PROMPT, "", strategy="hybrid", max_tokens=24)
        ids = torch.tensor([engine.tokenizer.encode(PROMPT).ids])
        logits = model.logits(ids)
        torch.save({"tokens": results, "logits": logits, "ids": ids,
                    "bytes_per_forward": channel.traffic.bytes_sent / max(1, channel.traffic.forwards)}, out)
        print(json.dumps({"rank": 0, "world": channel.world, "experts": model.expert_layouts}))
        return 0
    finally:
        channel.close()


if __name__ == "__main__":
    sys.exit(main())
