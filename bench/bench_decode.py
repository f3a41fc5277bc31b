"""CPU decoding of the shipped target: ours against transformers' generate and, given a build,
against llama.cpp's llama-bench on the same weights, depths and thread count.

    python bench/bench_decode.py [--models DIR] [--threads 2] [--rounds 5] [--depths 512,1200,2048]
                                 [--variants native,eager,int8,compiled] [--llamacpp LLAMA_CPP_DIR]
                                 [--out bench/results/bench_decode.json]
    python bench/bench_decode.py --target FILE.gguf --variants packed,native --depths 0,512,1024 \
                                 --no-transformers --llamacpp LLAMA_CPP_DIR   # a real model, its own GGUF

Figures, each the median over rounds that interleave every contender (a slow spell of the
machine then hits all alike):
- decode: ms per token of greedy decoding, 32 tokens after a prefilled context of real code
  at each depth (llama-bench -d DEPTH -n 32);
- transformers: ms per token of generate() at the first depth (the time of 33 new tokens less
  that of 1, over 32), with the greedy tokens checked equal to ours;
- prefill: tokens/s of a 1,024-token prompt (llama-bench -p 1024);
- verify: ms of one forward of 16 new tokens over 1,200 cached (llama-bench -p 16 -d 1200);
- pass: ms of one forward of 1, 2, 4, 8, 16 and 32 new tokens over 512 cached (llama-bench -p N -d 512);
- start-up: seconds to load each variant (and to compile it).

LLAMA_CPP_DIR is a llama.cpp source tree with build/bin/llama-bench built. With --target, both
read that GGUF file (variants: packed, the 8-bit blocks served by default; native, its weights
dequantized to fp32; int8). Otherwise the embedded target is converted to GGUF f32 with the tree's own convert_hf_to_gguf.py; its tokenizer's pre-tokenizer
is unknown to the converter, which is told to take it as qwen2: right for timing, which reads
no text, not for quality. llama.cpp is a measuring stick here, never a dependency.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from specdec import Segment, default_model_dir, load_model

SAMPLE = Path(__file__).resolve().parents[1] / "specdec"
NEW_TOKENS = 32
CONVERT = """import runpy, sys
sys.path.insert(0, sys.argv.pop(1))
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.argv[0] = "convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def code_tokens(tokenizer, count: int) -> torch.Tensor:
    """Real code (this repository's engine sources), count tokens of it."""
    text = "\n".join(p.read_text() for p in sorted(SAMPLE.glob("*.py")))
    ids = tokenizer.encode(text).ids
    return torch.tensor((ids * (count // len(ids) + 1))[:count])


@torch.inference_mode()
def ours_decode(model, ids, depth: int) -> tuple[float, list]:
    """ms per token of NEW_TOKENS greedy steps after `depth` prefilled tokens (at least one), and
    the tokens."""
    depth = max(depth, 1)
    cache = model.new_cache(depth + NEW_TOKENS + 1)
    logits = model(ids[:depth], torch.arange(depth), [Segment(cache, depth)], logits_rows=[depth - 1])
    cache.keep_all()
    token, out = int(logits[0].argmax()), []
    started = time.perf_counter()
    for _ in range(NEW_TOKENS):
        out.append(token)
        logits = model(torch.tensor([token]), torch.tensor([cache.length]), [Segment(cache, 1)])
        cache.keep_all()
        token = int(logits[0].argmax())
    return (time.perf_counter() - started) * 1000 / NEW_TOKENS, out


@torch.inference_mode()
def ours_prefill(model, ids, count: int = 1024) -> float:
    cache = model.new_cache(count)
    started = time.perf_counter()
    model(ids[:count], torch.arange(count), [Segment(cache, count)], logits_rows=[count - 1])
    return count / (time.perf_counter() - started)


@torch.inference_mode()
def ours_verify(model, ids, context: int = 1200, new: int = 16) -> float:
    """ms of one forward of `new` causal tokens over `context` cached ones."""
    cache = model.new_cache(context + new)
    model(ids[:context], torch.arange(context), [Segment(cache, context)], logits_rows=[context - 1])
    cache.keep_all()
    started = time.perf_counter()
    model(ids[context : context + new], torch.arange(context, context + new), [Segment(cache, new)])
    return (time.perf_counter() - started) * 1000


PASS_SIZES = (1, 2, 4, 8, 16, 32)  # tokens of a pass over 512 cached


@torch.inference_mode()
def hf_decode(model, ids, depth: int) -> tuple[float, list]:
    def generate(new):
        started = time.perf_counter()
        out = model.generate(ids[None, :depth], max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
        return (time.perf_counter() - started) * 1000, out[0, depth:].tolist()

    first_ms, _ = generate(1)
    all_ms, tokens = generate(NEW_TOKENS + 1)
    return (all_ms - first_ms) / NEW_TOKENS, tokens[:NEW_TOKENS]


def load_variant(models: Path, variant: str, target: Path | None = None):
    """(model, seconds to load it ready, compile included)."""
    started = time.perf_counter()
    if variant == "packed":
        if target is None:
            raise SystemExit("packed needs --target FILE.gguf")
        return load_model(target, packed=True), time.perf_counter() - started
    model = load_model(target or models / "target")  # with the native step where it runs
    if variant == "eager":
        model.native_step = None
    elif variant == "native":
        if model.native_step is None:
            from specdec.models.native import unsupported

            raise SystemExit(f"no native step: {unsupported(model) or 'no C compiler'}")
    elif variant == "int8":
        from specdec.models.quantize import quantize_int8

        quantize_int8(model)
    elif variant == "compiled":
        from specdec.models.compiled import compile_step

        compile_step(model)
    else:
        raise SystemExit(f"unknown variant {variant!r}: native, eager, int8, compiled")
    return model, time.perf_counter() - started


class LlamaBench:
    """llama-bench on the target converted to GGUF f32, one run per call (so rounds interleave)."""

    def __init__(self, tree: Path, models: Path, threads: int, workdir: Path, target: Path | None = None):
        tree = tree.resolve()
        self.binary = tree / "build" / "bin" / "llama-bench"
        if not self.binary.exists():
            raise SystemExit(f"{self.binary}: not built (cmake -B build && cmake --build build --target llama-bench)")
        self.gguf, self.threads = target or workdir / "target-f32.gguf", threads
        if target is not None:  # the very file we read
            return
        script = workdir / "convert.py"
        script.write_text(CONVERT)
        done = subprocess.run([sys.executable, str(script), str(tree), str(models.resolve() / "target"),
                               "--outtype", "f32", "--outfile", str(self.gguf)], cwd=tree, capture_output=True,
                              text=True, env={"PYTHONPATH": str(tree / "gguf-py"), "PATH": "/usr/bin:/bin"})
        if done.returncode:
            raise SystemExit(f"GGUF conversion failed:\n{done.stderr[-2000:]}")

    def run(self, *args) -> list[dict]:
        command = [str(self.binary), "-m", str(self.gguf), "-t", str(self.threads), "-r", "1", "-o", "json", *args]
        done = subprocess.run(command, check=True, capture_output=True, text=True)
        return json.loads(done.stdout)

    def decode_ms(self, depths) -> dict:
        rows = self.run("-p", "0", "-n", str(NEW_TOKENS), "-d", ",".join(map(str, depths)))
        return {r["n_depth"]: 1000 / r["avg_ts"] for r in rows}

    def prefill_tps(self) -> float:
        return self.run("-p", "1024", "-n", "0")[0]["avg_ts"]

    def verify_ms(self) -> float:
        return 16 * 1000 / self.run("-p", "16", "-n", "0", "-d", "1200")[0]["avg_ts"]

    def pass_ms(self) -> dict:
        rows = self.run("-p", ",".join(map(str, PASS_SIZES)), "-n", "0", "-d", "512")
        return {r["n_prompt"]: r["n_prompt"] * 1000 / r["avg_ts"] for r in rows}


def hf_model(models: Path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(models / "target", dtype=torch.float32).eval()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=Path, default=default_model_dir())
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--depths", default="512,1200,2048")
    p.add_argument("--variants", default="native,eager", help="comma-separated: native, eager, int8, compiled")
    p.add_argument("--llamacpp", type=Path, help="a llama.cpp source tree with llama-bench built")
    p.add_argument("--no-transformers", action="store_true")
    p.add_argument("--out", type=Path)
    p.add_argument("--target", type=Path, help="a GGUF file: ours and llama.cpp both read it")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    depths = [int(d) for d in args.depths.split(",")]
    variants, startup = {}, {}
    for name in args.variants.split(","):
        variants[name], startup[name] = load_variant(args.models, name, args.target)
    ids = code_tokens(next(iter(variants.values())).tokenizer, max(depths + [1216]) + NEW_TOKENS + 1)
    hf = None if args.no_transformers else hf_model(args.models)
    with tempfile.TemporaryDirectory() as tmp:
        llama = LlamaBench(args.llamacpp, args.models, args.threads, Path(tmp), args.target) if args.llamacpp else None
        samples, tokens = _rounds(args, depths, variants, hf, llama, ids)
    report = _report(args, depths, samples, tokens, startup)
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["same_tokens_as_transformers"] in (True, None) else 1


def _rounds(args, depths, variants, hf, llama, ids):
    samples, tokens = {}, {}

    def add(key, value):
        samples.setdefault(key, []).append(value)

    for round_ in range(args.rounds):
        for name, model in variants.items():
            for depth in depths:
                ms, tokens[name, depth] = ours_decode(model, ids, depth)
                add(f"{name}/decode_ms/{depth}", ms)
            add(f"{name}/prefill_tps", ours_prefill(model, ids))
            add(f"{name}/verify16_ms", ours_verify(model, ids))
            for new in PASS_SIZES:
                add(f"{name}/pass_ms/{new}", ours_verify(model, ids, context=512, new=new))
        if llama:
            for new, ms in llama.pass_ms().items():
                add(f"llama.cpp/pass_ms/{new}", ms)
            for depth, ms in llama.decode_ms(depths).items():
                add(f"llama.cpp/decode_ms/{depth}", ms)
            add("llama.cpp/prefill_tps", llama.prefill_tps())
            add("llama.cpp/verify16_ms", llama.verify_ms())
        if hf is not None and round_ < 2:  # slow, and steadier than ours
            ms, tokens["transformers", depths[0]] = hf_decode(hf, ids, depths[0])
            add(f"transformers/decode_ms/{depths[0]}", ms)
    return samples, tokens


def _report(args, depths, samples, tokens, startup) -> dict:
    medians = {key: round(statistics.median(values), 3) for key, values in samples.items()}
    report = {"threads": args.threads, "rounds": args.rounds, "new_tokens": NEW_TOKENS, "depths": depths,
              "medians": medians, "startup_s": {k: round(v, 1) for k, v in startup.items()}}
    ratios = {}
    for name in startup:
        for depth in depths:
            theirs = medians.get(f"llama.cpp/decode_ms/{depth}")
            if theirs:  # > 1: we are faster
                ratios[f"{name}/decode_speed_vs_llama.cpp/{depth}"] = round(theirs / medians[f"{name}/decode_ms/{depth}"], 3)
        hf_ms = medians.get(f"transformers/decode_ms/{depths[0]}")
        if hf_ms:
            ratios[f"{name}/decode_speed_vs_transformers/{depths[0]}"] = round(hf_ms / medians[f"{name}/decode_ms/{depths[0]}"], 3)
        single = medians.get(f"{name}/pass_ms/1")
        if single:  # what a pass of 16 costs in single steps (llama.cpp's own below)
            ratios[f"{name}/pass16_over_pass1"] = round(medians[f"{name}/pass_ms/16"] / single, 3)
        theirs = medians.get("llama.cpp/prefill_tps")
        if theirs:
            ratios[f"{name}/prefill_vs_llama.cpp"] = round(medians[f"{name}/prefill_tps"] / theirs, 3)
    if medians.get("llama.cpp/pass_ms/1"):
        ratios["llama.cpp/pass16_over_pass1"] = round(medians["llama.cpp/pass_ms/16"] / medians["llama.cpp/pass_ms/1"], 3)
    report["speed_ratios"] = ratios
    hf_tokens = tokens.get(("transformers", depths[0]))
    # Each fp32 variant's greedy tokens against transformers' (int8 is another model's own).
    report["same_tokens_as_transformers"] = None if hf_tokens is None else all(
        tokens[name, depths[0]] == hf_tokens for name in startup if name != "int8")
    return report


if __name__ == "__main__":
    sys.exit(main())
