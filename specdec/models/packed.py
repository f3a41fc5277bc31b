"""Weights packed in 8-bit blocks for the native step's integer products (kernels/cpu_quant.h).

A packed matrix keeps, for each row and each block of 32 columns, unsigned bytes q with
w = scale * (q - zero) + offset. GGUF's Q8_0, Q5_0 and Q4_0 blocks and Q4_K's sub-blocks map
onto this exactly (their own integers, their own scales); any other format (Q6_K's 16-column
scales, F16, F32) is requantized per block of 32 to signed 8 bits around zero 128. The step then
reads about one byte per weight and multiplies in integers, and no float copy of the weights
is ever made.

Rows are packed first (PackedRows: concatenated for the fused qkv, permuted for Llama's q/k),
then laid out in the kernels' tiles of 16 rows (PackedMatrix).
"""

import ctypes
from dataclasses import dataclass

import numpy as np
import torch

from specdec_kernels import cpu_decode

BLOCK, TILE = 32, 16


@dataclass
class PackedRows:
    q: np.ndarray  # uint8 [rows, cols]
    scale: np.ndarray  # float32 [rows, cols / 32]
    offset: np.ndarray | None  # float32 [rows, cols / 32], or None: all zero
    zero: int  # one for the whole matrix: the kernels start each block's sum at -zero * sum(x)

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape

    def dequantized(self) -> np.ndarray:
        """The floats the rows stand for (tests; the kernels never make them)."""
        rows, cols = self.q.shape
        values = self.q.reshape(rows, -1, BLOCK).astype(np.float32) - np.float32(self.zero)
        values = values * self.scale[:, :, None]
        if self.offset is not None:
            values = values + self.offset[:, :, None]
        return values.reshape(rows, cols)

    def take_rows(self, order: np.ndarray) -> "PackedRows":
        offset = None if self.offset is None else self.offset[order]
        return PackedRows(self.q[order], self.scale[order], offset, self.zero)


def concat_rows(parts: list[PackedRows]) -> PackedRows:
    """Matrices stacked by rows (the fused [q; k; v]); an offset-free part gets zero offsets
    when another part has offsets. Parts of different zeros (Q5_0's 16 beside Q8_0's 128) are
    moved to the largest, exactly: every format's q - zero lies in [-zero, zero - 1] or, for
    Q4_K, in [0, 15], so q - zero + the largest zero stays a byte."""
    zero = max(part.zero for part in parts)
    offsets = None
    if any(part.offset is not None for part in parts):
        offsets = np.concatenate([np.zeros_like(p.scale) if p.offset is None else p.offset for p in parts])
    q = np.concatenate([(p.q.astype(np.int16) + (zero - p.zero)).astype(np.uint8) for p in parts])
    return PackedRows(q, np.concatenate([p.scale for p in parts]), offsets, zero)


def from_floats(values: np.ndarray) -> PackedRows:
    """Any float matrix, per block of 32 by its largest magnitude: q - 128 in [-127, 127]."""
    values = np.asarray(values, dtype=np.float32)
    rows, cols = values.shape
    blocks = values.reshape(rows, cols // BLOCK, BLOCK)
    scale = (np.abs(blocks).max(axis=2) / 127).astype(np.float32)
    inverse = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
    q = np.rint(blocks * inverse[:, :, None]).clip(-127, 127).astype(np.int16) + 128
    return PackedRows(q.astype(np.uint8).reshape(rows, cols), scale, None, 128)


def _half_scales(raw: np.ndarray, at: int) -> np.ndarray:
    return raw[:, :, at:at + 2].copy().view(np.float16)[:, :, 0].astype(np.float32)


def _q8_0(raw):  # blocks of 34 bytes: d (f16), 32 int8
    return raw[:, :, 2:] ^ np.uint8(0x80), _half_scales(raw, 0), None, 128  # q + 128, as bytes


def _q4_0(raw):  # blocks of 18 bytes: d (f16), 16 bytes: low nibbles 0-15, high nibbles 16-31
    nibbles = raw[:, :, 2:]
    return np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=2), _half_scales(raw, 0), None, 8


def _q5_0(raw):  # blocks of 22 bytes: d (f16), 32 high bits (u32), 16 bytes of low nibbles
    high = raw[:, :, 2:6].copy().view(np.uint32)[:, :, 0]
    bits = ((high[:, :, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4
    nibbles = raw[:, :, 6:]
    return np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=2) | bits, _half_scales(raw, 0), None, 16


def _q4_k(raw):
    """Super-blocks of 256 (144 bytes): d, dmin (f16), 12 bytes of 6-bit scales and mins for
    eight sub-blocks of 32, then 128 bytes of nibbles (each 32 bytes: two sub-blocks)."""
    d, dmin = _half_scales(raw, 0), _half_scales(raw, 2)
    packed = raw[:, :, 4:16].astype(np.uint8)
    low, high = packed[:, :, 0:4], packed[:, :, 8:12]
    scales = np.concatenate([low & 63, (high & 0x0F) | ((low >> 6) << 4)], axis=2)
    mins = np.concatenate([packed[:, :, 4:8] & 63, (high >> 4) | ((packed[:, :, 4:8] >> 6) << 4)], axis=2)
    nibbles = raw[:, :, 16:].reshape(*raw.shape[:2], 4, 32)
    q = np.stack([nibbles & 0x0F, nibbles >> 4], axis=3).reshape(*raw.shape[:2], 8, 32)
    scale = (d[:, :, None] * scales.astype(np.float32)).astype(np.float32)
    offset = -(dmin[:, :, None] * mins.astype(np.float32)).astype(np.float32)
    rows = raw.shape[0]
    return q.reshape(rows, -1, 32), scale.reshape(rows, -1), offset.reshape(rows, -1), 0


_EXACT = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q5_0": _q5_0, "Q4_K": _q4_k}


def from_gguf(raw: np.ndarray, kind_name: str, dequantize) -> PackedRows:
    """A 2-D GGUF tensor's stored blocks (raw [rows, bytes per row]) packed; `dequantize()` gives
    its floats for the formats packed by requantizing."""
    unpack = _EXACT.get(kind_name)
    if unpack is None:
        return from_floats(dequantize())
    rows = raw.shape[0]
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    _, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[kind_name]]
    q, scale, offset, zero = unpack(raw.reshape(rows, -1, block_bytes))
    return PackedRows(np.ascontiguousarray(q.reshape(rows, -1), dtype=np.uint8), scale.reshape(rows, -1),
                      None if offset is None else offset.reshape(rows, -1), zero)


class PackedMatrix:
    """Rows laid out in the kernels' tiles, with the C descriptor pointing into them."""

    def __init__(self, rows: PackedRows):
        count, cols = rows.shape
        if cols % BLOCK:
            raise ValueError(f"a packed matrix needs columns in blocks of {BLOCK}, not {cols}")
        tiles, blocks, pad = -(-count // TILE), cols // BLOCK, -count % TILE
        q = np.pad(rows.q, ((0, pad), (0, 0))).reshape(tiles, TILE, blocks, 8, 4)
        self.q = np.ascontiguousarray(q.transpose(0, 2, 3, 1, 4))
        self.scale = _tiled(rows.scale, pad, tiles, blocks)
        self.offset = None if rows.offset is None else _tiled(rows.offset, pad, tiles, blocks)
        self.zero = int(rows.zero)
        self.rows, self.cols, self.qmax = count, cols, int(rows.q.max(initial=0))
        self.desc = cpu_decode.QMat(self.q.ctypes.data, self.scale.ctypes.data,
                                    None if self.offset is None else self.offset.ctypes.data,
                                    self.zero, count, cols, self.qmax)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.q, self.scale, self.offset) if a is not None)


def _tiled(per_block: np.ndarray, pad: int, tiles: int, blocks: int) -> np.ndarray:
    padded = np.pad(per_block.astype(np.float32), ((0, pad), (0, 0))).reshape(tiles, TILE, blocks)
    return np.ascontiguousarray(padded.transpose(0, 2, 1))


def model_matrices(rows: dict, num_layers: int, tied: bool) -> dict:
    """The native step's matrices from a checkpoint's packed rows (Hugging Face names), each
    made once and its rows dropped: embed, lm_head, and per layer qkv (fused), o, gate, up, down."""
    def take(name: str) -> PackedRows:
        if name not in rows:
            raise KeyError(f"the checkpoint has no {name}")
        return rows.pop(name)

    matrices = {"embed": PackedMatrix(take("model.embed_tokens.weight"))}
    matrices["lm_head"] = matrices["embed"] if tied else PackedMatrix(take("lm_head.weight"))
    for i in range(num_layers):
        at = f"model.layers.{i}."
        attention = [take(at + f"self_attn.{p}_proj.weight") for p in "qkv"]
        matrices[f"{i}.qkv"] = PackedMatrix(concat_rows(attention))
        matrices[f"{i}.o"] = PackedMatrix(take(at + "self_attn.o_proj.weight"))
        for part in ("gate", "up", "down"):
            matrices[f"{i}.{part}"] = PackedMatrix(take(at + f"mlp.{part}_proj.weight"))
    return matrices


class PackedLinear(torch.nn.Module):
    """y = x W^T with W packed in 8-bit blocks, through the native library's integer products
    (specdec_qgemm): a small model's one-row products (an EAGLE-3 head's drafting steps) read a
    byte per weight instead of four. Inference only; activations are quantized per block of 32
    as the native step's are."""

    def __init__(self, weight: torch.Tensor, lib, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else bias.detach().float()
        self.matrix = PackedMatrix(from_floats(weight.detach().float().numpy()))
        self.lib, self.desc = lib, ctypes.byref(self.matrix.desc)
        self.kernel = cpu_decode.QKERNELS[cpu_decode.qkernel() or "portable"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float().contiguous()
        out = torch.empty(flat.shape[0], self.out_features)
        if self.lib.specdec_qgemm(self.desc, flat.data_ptr(), flat.shape[0], out.data_ptr(), self.kernel,
                                  torch.get_num_threads()):
            raise MemoryError("the packed product could not allocate its scratch memory")
        if self.bias is not None:
            out += self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


class PackedEmbedding(torch.nn.Module):
    """Rows of a packed matrix looked up as floats: a head reads its target's packed embedding
    in place, not a float copy of it (a 0.5B model's is 545 MB in fp32)."""

    def __init__(self, matrix: PackedMatrix):
        super().__init__()
        self.matrix = matrix

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        m, rows = self.matrix, ids.reshape(-1).numpy()
        tile, within = rows // TILE, rows % TILE
        q = m.q[tile, :, :, within, :].reshape(len(rows), -1, BLOCK).astype(np.float32)  # [n, blocks, 32]
        values = (q - np.float32(m.zero)) * m.scale[tile, :, within][:, :, None]
        if m.offset is not None:
            values += m.offset[tile, :, within][:, :, None]
        return torch.from_numpy(values.reshape(*ids.shape, m.cols))


def packs(weight: torch.Tensor) -> bool:
    """Whether a weight can be packed: its columns in whole blocks of 32."""
    return weight.dim() == 2 and weight.shape[1] % BLOCK == 0
