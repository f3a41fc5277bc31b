"""Loading (and saving) Hugging Face checkpoint directories: config.json, safetensors, tokenizer.json;
and loading GGUF files (gguf_checkpoint.py), whose tensors arrive under the same names.

Per-expert checkpoint tensors (Qwen3-MoE's mlp.experts.{e}.gate_proj/up_proj/down_proj,
Mixtral's block_sparse_moe.experts.{e}.w1/w3/w2) are stacked into the fused layout the kernels
read: gate_up [E, 2I, H] (gate rows first) and down [E, H, I]. transformers v5's fused names
load as they are. FP8 weights with block scales (`weight_scale_inv`, as DeepSeek ships them)
and GPT-OSS's MXFP4 experts are decoded as they are read.

Each tensor goes to the load device and dtype as it is read, file by file: a GPU load never
holds the whole model in host memory, only the tensor being read (and the experts of one layer
until they are stacked).
"""

import json
import math
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdec.models import native
from specdec.models.config import GPT_OSS, ConfigError, ModelConfig
from specdec.models.gguf_checkpoint import GgufCheckpoint, is_gguf
from specdec.models.model import SparseMoeBlock, Transformer
from specdec.models.ops import half_swap

_PER_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(\w+)\.weight$")
_FUSED_EXPERTS = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")
_RENAMED_PARTS = {"router.weight": "gate.weight", "router.bias": "gate.bias", "router.layer.weight": "gate.weight",
                  "input_linear.weight": "experts.gate_up_proj", "output_linear.weight": "experts.down_proj"}
_EXPERT_PART = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


class CheckpointError(ValueError):
    """A checkpoint directory whose files disagree with its config, with the details in the message."""


def load_model(path, dtype=torch.float32, device="cpu", experts: dict | None = None, packed: bool = False) -> Transformer:
    """An HF-layout directory or a .gguf file -> Transformer in eval mode, with .tokenizer when the
    checkpoint has one (tokenizer.json, or a GGUF file's vocabulary).

    experts {MoE layer: [global expert ids]}: keep only those experts of each layer, in that
    order (expert parallelism); the other experts' tensors are never read from disk.
    packed: a GGUF file's matrices kept in 8-bit blocks (specdec.models.packed), run by the native
    step alone; no float copy of them is made."""
    path = Path(path)
    dtype = _DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if packed:
        return _load_gguf_packed(path)
    if is_gguf(path):
        return _load_gguf(path, dtype, device, experts)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory or a GGUF file; expected a Hugging Face model directory "
                              "or a .gguf file")
    cfg = ModelConfig.from_file(path / "config.json")
    check_fits_memory(path, dtype, device, experts)
    checkpoint = _fp8_dequantized(_iter_checkpoint(path, _expert_filter(experts)), _fp8_block(cfg), path)
    if cfg.architecture == GPT_OSS:
        checkpoint = _gpt_oss_tensors(checkpoint, path)
    return _assemble(path, cfg, checkpoint, _load_tokenizer(path), dtype, device, experts)


def _load_gguf(path: Path, dtype, device, experts: dict | None) -> Transformer:
    from specdec.models.gguf_tokenizer import tokenizer_from_gguf

    checkpoint, rows_of = GgufCheckpoint(path), _expert_filter(experts)
    cfg = ModelConfig.from_dict(checkpoint.raw_config())
    _refuse_unless_fits(path, checkpoint.weight_bytes(dtype, rows_of), dtype, device)
    tokenizer = tokenizer_from_gguf(checkpoint)
    return _assemble(path, cfg, checkpoint.iter_tensors(rows_of), tokenizer, dtype, device, experts)


def _load_gguf_packed(path: Path) -> Transformer:
    from specdec.models.gguf_tokenizer import tokenizer_from_gguf
    from specdec.models.packed import PackedRows, model_matrices

    if not is_gguf(path):
        raise CheckpointError(f"{path}: packed 8-bit weights are made from a GGUF file's blocks; "
                              "pass a .gguf file, or --quantize int8 for other checkpoints")
    checkpoint = GgufCheckpoint(path)
    cfg = ModelConfig.from_dict(checkpoint.raw_config())
    if cfg.num_experts:
        raise ConfigError(f"{path}: packed weights cover dense models; run this MoE model without packing")
    with torch.device("meta"):
        model = Transformer(cfg)
    rows, tensors = {}, {}
    for name, value in checkpoint.iter_packed():
        (rows if isinstance(value, PackedRows) else tensors)[name] = value
    model.load_state_dict(tensors, strict=False, assign=True)
    model.packed = model_matrices(rows, cfg.num_layers, tied="lm_head.weight" not in rows)
    model.quantization = "blocks"  # what --quantize names it, as int8 names its own
    model.tokenizer, model.path = tokenizer_from_gguf(checkpoint), path
    half_swap(cfg.head_dim, torch.float32, torch.device("cpu"))
    if not native.bind(model):
        raise ConfigError(f"{path}: packed weights need the native CPU step, which cannot run here: "
                          f"{native.unsupported(model) or cpu_decode_why_not()}")
    return model.eval()


def cpu_decode_why_not() -> str:
    from specdec_kernels import cpu_decode

    return cpu_decode.why_not() or "SPECDEC_NATIVE=0"


def _assemble(path: Path, cfg: ModelConfig, checkpoint, tokenizer, dtype, device, experts) -> Transformer:
    """A Transformer of `cfg` with the checkpoint's (name, tensor) pairs assigned, ready to run."""
    with torch.device("meta"):
        model = Transformer(cfg)
        if experts is not None:
            _shrink_experts(model, experts)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        expected.pop("lm_head.weight")
    model.load_state_dict(_read_tensors(path, cfg, checkpoint, expected, dtype, device, experts), strict=False,
                          assign=True)
    model.tie_weights()
    for module in model.modules():
        if isinstance(module, SparseMoeBlock):
            module.tokens_per_expert = torch.zeros(cfg.num_experts, dtype=torch.long, device=device)
    model.tokenizer = tokenizer
    model.path = path
    model.fuse_for_inference()
    native.bind(model)
    return model.eval()


HEADROOM = 1.15  # caches, activations and the allocator's slack on top of the weights


def weight_bytes(path: Path, dtype, experts: dict | None = None) -> int:
    """The weights' size once loaded in `dtype`, from the safetensors headers (nothing is read);
    with `experts` (a shard), other experts' tensors are not counted."""
    element = torch.tensor([], dtype=dtype).element_size()
    total, keep = 0, _expert_filter(experts)
    for file in _checkpoint_files(path):
        try:
            with safe_open(path / file, framework="pt") as handle:
                shapes = {name: handle.get_slice(name).get_shape() for name in handle.keys()}
        except (OSError, RuntimeError, ValueError) as err:
            raise CheckpointError(f"{path / file}: cannot read safetensors file ({err})") from None
        for name, shape in shapes.items():
            if name.endswith(("_scales", "weight_scale_inv")):  # MXFP4 and FP8: decoded into the weights
                continue
            count = math.prod(shape) * (2 if name.endswith("_blocks") else 1)  # blocks: two e2m1 values a byte
            rows = keep(name)
            if rows is not None:
                count = count * len(rows) // max(1, shape[0]) if rows else 0
            total += count * element
    return total


def available_bytes(device) -> int:
    """Memory free for the weights: the GPU's free memory, or the machine's available RAM."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 1 << 62  # not Linux: no estimate to refuse on


def check_fits_memory(path: Path, dtype, device, experts: dict | None = None) -> None:
    """Refuse, before reading any weight, a model that will not fit where it is loaded."""
    _refuse_unless_fits(path, weight_bytes(path, dtype, experts), dtype, device)


def _refuse_unless_fits(path: Path, weights: int, dtype, device) -> None:
    need, free = weights * HEADROOM, available_bytes(device)
    if need > free:
        raise CheckpointError(f"{path}: the weights need about {need / 2**30:.1f} GiB in {dtype} (with "
                              f"{HEADROOM - 1:.0%} headroom) but {device} has {free / 2**30:.1f} GiB free; use a "
                              "smaller dtype (bf16), a larger device, or --expert-parallel across ranks")


def _shrink_experts(model: Transformer, experts: dict) -> None:
    for layer, block in enumerate(model.model.layers):
        if isinstance(block.mlp, SparseMoeBlock) and layer in experts:
            stacked = block.mlp.experts
            count = len(experts[layer])
            stacked.gate_up_proj = torch.nn.Parameter(torch.empty(count, *stacked.gate_up_proj.shape[1:]))
            stacked.down_proj = torch.nn.Parameter(torch.empty(count, *stacked.down_proj.shape[1:]))


def _expert_filter(experts: dict | None):
    """name -> None (read it all), [] (skip it) or the expert rows to read, under a shard."""
    def rows(name: str):
        if experts is None:
            return None
        name = _canonical_name(name)
        match = _PER_EXPERT.match(name.removesuffix("_scale_inv"))  # an FP8 weight's scales go with it
        if match:
            layer = int(name.split(".")[2])
            return None if int(match.group(2)) in experts.get(layer, ()) else []
        fused = _FUSED_EXPERTS.match(name)
        return experts.get(int(fused.group(1))) if fused else None
    return rows


def _read_tensors(path: Path, cfg: ModelConfig, checkpoint, expected: dict, dtype, device,
                  shard: dict | None = None) -> dict:
    tensors, experts, unexpected = {}, {}, []
    for name, tensor in checkpoint:
        name = _canonical_name(name)
        tensor = tensor.to(device=device, dtype=dtype)
        match = _PER_EXPERT.match(name)
        if match and match.group(3) in _EXPERT_PART:
            prefix, expert, part = match.group(1), int(match.group(2)), _EXPERT_PART[match.group(3)]
            parts = experts.setdefault(prefix, {})
            parts[(expert, part)] = tensor
            wanted = _wanted_experts(cfg, prefix, shard)
            if len(parts) == 3 * len(wanted):  # a layer's experts complete: stacked now, their parts freed
                tensors.update(_stack_experts(prefix, experts.pop(prefix), wanted, cfg.num_experts, unexpected))
        elif name in expected:
            tensors[name] = tensor
        elif not (name == "lm_head.weight" and cfg.tie_word_embeddings):
            unexpected.append(name)
    for prefix, parts in experts.items():  # layers whose experts came incomplete: named as problems
        tensors.update(_stack_experts(prefix, parts, _wanted_experts(cfg, prefix, shard), cfg.num_experts, unexpected))
    problems = _problems(expected, tensors, unexpected)
    if problems:
        raise CheckpointError(f"{path}: checkpoint does not match config.json:\n  " + "\n  ".join(problems))
    return tensors


def _wanted_experts(cfg: ModelConfig, prefix: str, shard: dict | None) -> list:
    layer = int(prefix.split(".")[2])
    return list(shard[layer] if shard is not None and layer in shard else range(cfg.num_experts))


def _fp8_block(cfg: ModelConfig) -> tuple[int, int]:
    quantization = cfg.raw.get("quantization_config") or {}
    block = quantization.get("weight_block_size") or (128, 128)
    return int(block[0]), int(block[1])


def _fp8_dequantized(checkpoint, block: tuple[int, int], path: Path):
    """FP8 weights (e4m3/e5m2) with their `weight_scale_inv` [ceil(out/bo), ceil(in/bi)] become
    weight * scale of its block, in fp32; the two may come in either order, or other files."""
    pending = {}
    for name, tensor in checkpoint:
        if name.endswith(".weight_scale_inv"):
            key, part = name[: -len("_scale_inv")], "scale"
        elif tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) and name.endswith(".weight"):
            key, part = name, "weight"
        else:
            yield name, tensor
            continue
        parts = pending.setdefault(key, {})
        parts[part] = tensor
        if len(parts) == 2:
            del pending[key]
            yield key, _dequantize_fp8(parts["weight"], parts["scale"], block, key, path)
    if pending:
        missing = ", ".join(f"{k} ({'scale' if 'weight' in v else 'weight'})" for k, v in sorted(pending.items()))
        raise CheckpointError(f"{path}: FP8 weights without their block scales or the reverse: {missing}")


def _dequantize_fp8(weight, scale, block: tuple[int, int], name: str, path: Path) -> torch.Tensor:
    rows, cols = weight.shape[-2:]
    expected = (-(-rows // block[0]), -(-cols // block[1]))
    if tuple(scale.shape[-2:]) != expected:
        raise CheckpointError(f"{path}: {name}: block scales {tuple(scale.shape)} do not fit the weight "
                              f"{tuple(weight.shape)} in blocks of {block[0]}x{block[1]} (expected {expected})")
    full = scale.float().repeat_interleave(block[0], dim=-2)[..., :rows, :]
    full = full.repeat_interleave(block[1], dim=-1)[..., :cols]
    return weight.float() * full


_GPT_OSS_MXFP4 = re.compile(r"^(.*\.mlp\.experts\.(?:gate_up_proj|down_proj))_(blocks|scales)$")


def _gpt_oss_tensors(checkpoint, path: Path):
    """GPT-OSS's names and layouts -> this model's: the router is the gate; experts are stored
    input-major ([E, H, 2I] with gate and up interleaved, [E, I, H]) or as MXFP4 blocks and
    scales ([E, out, in/32, 16], [E, out, in/32]), and become [E, 2I, H] (gate rows first) and
    [E, H, I]. MXFP4 experts are decoded here (the layout the MXFP4 kernels read is the same)."""
    from specdec_kernels import dequantize_mxfp4

    pending = {}
    for name, tensor in checkpoint:
        mxfp4 = _GPT_OSS_MXFP4.match(name)
        if mxfp4:
            parts = pending.setdefault(mxfp4.group(1), {})
            parts[mxfp4.group(2)] = tensor
            if len(parts) == 2:
                base, blocks = mxfp4.group(1), pending.pop(mxfp4.group(1))["blocks"]
                weight = dequantize_mxfp4(blocks.reshape(*blocks.shape[:2], -1), parts["scales"])  # [E, out, in]
                yield base, _gate_rows_first(weight, dim=1) if base.endswith("gate_up_proj") else weight
            continue
        if name.endswith(".mlp.experts.gate_up_proj"):
            yield name, _gate_rows_first(tensor.transpose(1, 2), dim=1)
        elif name.endswith(".mlp.experts.gate_up_proj_bias"):
            yield name, _gate_rows_first(tensor, dim=1)
        elif name.endswith(".mlp.experts.down_proj"):
            yield name, tensor.transpose(1, 2).contiguous()
        else:
            yield name, tensor
    if pending:
        raise CheckpointError(f"{path}: MXFP4 tensors without their pair: {sorted(pending)}")


def _gate_rows_first(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    """Interleaved gate/up (gate at even indices of `dim`) -> gate half first, then up."""
    size = tensor.shape[dim]
    order = torch.cat([torch.arange(0, size, 2), torch.arange(1, size, 2)])
    return tensor.index_select(dim, order).contiguous()


def _canonical_name(name: str) -> str:
    """A checkpoint tensor's name in this model's terms: Mixtral's block_sparse_moe and
    DeepSeek's shared_experts, and the routers (GPT-OSS, Granite-MoE) and stacked experts
    (Granite-MoE) named otherwise (others unchanged)."""
    name = name.replace(".block_sparse_moe.", ".mlp.").replace(".mlp.shared_experts.", ".mlp.shared_expert.")
    block, _, part = name.rpartition(".mlp.")
    return f"{block}.mlp.{_RENAMED_PARTS[part]}" if block and part in _RENAMED_PARTS else name


def _stack_experts(prefix: str, parts: dict, wanted: list, num_experts: int, unexpected: list) -> dict:
    """Per-expert {(e, 'gate'|'up'|'down'): tensor} -> the two stacked parameters of the wanted
    experts (in that order), if complete."""
    for expert, part in parts:
        if expert >= num_experts:
            unexpected.append(f"{prefix}.{expert}.{part}")
    complete = all((e, p) in parts for e in wanted for p in ("gate", "up", "down"))
    if not complete:
        missing = [f"{prefix}.{e}.{p}" for e in wanted for p in ("gate", "up", "down") if (e, p) not in parts]
        unexpected.extend(f"(missing) {m}" for m in missing)
        return {}
    try:
        gate_up = torch.stack([torch.cat([parts[(e, "gate")], parts[(e, "up")]]) for e in wanted])
        down = torch.stack([parts[(e, "down")] for e in wanted])
    except RuntimeError as err:
        unexpected.append(f"{prefix}: expert tensors of different shapes ({err})")
        return {}
    return {f"{prefix}.gate_up_proj": gate_up, f"{prefix}.down_proj": down}


def _problems(expected: dict, tensors: dict, unexpected: list) -> list:
    problems = [f"missing tensor {n} {tuple(s)}" for n, s in expected.items() if n not in tensors]
    problems += [f"unexpected tensor {n}" for n in unexpected]
    problems += [
        f"shape of {n}: checkpoint {tuple(t.shape)}, config wants {tuple(expected[n])}"
        for n, t in tensors.items()
        if n in expected and tuple(t.shape) != tuple(expected[n])
    ]
    return problems


def _checkpoint_files(path: Path) -> list[str]:
    """The safetensors files of a checkpoint: its index's, or the single model.safetensors."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as err:
            raise CheckpointError(f"{index}: not a valid safetensors index ({err})") from None
        return sorted(set(weight_map.values()))
    if (path / "model.safetensors").exists():
        return ["model.safetensors"]
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json")


def _iter_checkpoint(path: Path, rows_of=lambda name: None):
    """(name, tensor) of every checkpoint tensor; rows_of(name) may skip one ([]) or pick the
    expert rows of a stacked one (a list), read without reading the rest."""
    for file in _checkpoint_files(path):
        try:
            with safe_open(path / file, framework="pt") as handle:
                for name in handle.keys():
                    rows = rows_of(name)
                    if rows is None:
                        yield name, handle.get_tensor(name)
                    elif rows:
                        stacked = handle.get_slice(name)
                        yield name, torch.cat([stacked[e : e + 1] for e in rows])
        except (OSError, RuntimeError, ValueError) as err:
            raise CheckpointError(f"{path / file}: cannot read safetensors file ({err})") from None


def _load_tokenizer(path: Path):
    file = path / "tokenizer.json"
    if not file.exists():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(file))


def save_model(model: Transformer, path, raw_config: dict) -> None:
    """Write config.json and model.safetensors in the per-expert layout transformers reads."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len(".gate_up_proj")]
            for e, stacked in enumerate(tensor):
                gate, up = stacked.chunk(2)
                tensors[f"{prefix}.{e}.gate_proj.weight"] = gate
                tensors[f"{prefix}.{e}.up_proj.weight"] = up
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len(".down_proj")]
            for e, down in enumerate(tensor):
                tensors[f"{prefix}.{e}.down_proj.weight"] = down
        else:
            tensors[name] = tensor
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(raw_config, indent=2) + "\n")
