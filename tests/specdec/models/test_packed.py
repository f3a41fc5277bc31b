"""Packed 8-bit blocks: GGUF blocks packed exactly, the integer kernels against each other and
against floats, and a packed GGUF model against its float reference."""

import ctypes
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from specdec import load_model
from specdec.models import native
from specdec.models.config import ConfigError
from specdec.models.loader import CheckpointError
from specdec.models.model import Segment
from specdec.models.packed import PackedMatrix, PackedRows, concat_rows, from_floats, from_gguf
from specdec.models.quantize import quantize_target
from specdec_kernels import cpu_decode
from tests.specdec.models.gguf_files import write_gguf
from tests.specdec.models.test_gguf import IDS, tiny_transformers_model

RNG = np.random.default_rng(0)


def _raw(values: np.ndarray, kind: str) -> np.ndarray:
    return gguf.quants.quantize(values, GGMLQuantizationType[kind])


def _packed(raw: np.ndarray, kind: str):
    return from_gguf(raw, kind, lambda: gguf.quants.dequantize(raw, GGMLQuantizationType[kind]))


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q5_0"])
def test_simple_blocks_are_packed_with_their_own_integers_and_scales(kind):
    raw = _raw(RNG.standard_normal((8, 96)).astype(np.float32), kind)
    expected = gguf.quants.dequantize(raw, GGMLQuantizationType[kind])
    assert np.array_equal(_packed(raw, kind).dequantized(), expected)


def test_q4_k_sub_blocks_are_packed_with_their_scales_and_mins():
    raw = RNG.integers(0, 256, size=(6, 144), dtype=np.uint8)  # one super-block of 256 per row
    raw[:, 0:4] = np.array([0.01, 0.002], dtype=np.float16).view(np.uint8)  # d, dmin: finite
    expected = gguf.quants.dequantize(raw, GGMLQuantizationType.Q4_K)
    packed = _packed(raw, "Q4_K")
    assert packed.offset is not None
    assert np.allclose(packed.dequantized(), expected, rtol=0, atol=1e-6)


def test_other_formats_are_requantized_within_half_a_step():
    raw = RNG.integers(0, 256, size=(4, 210), dtype=np.uint8)  # Q6_K: 16-column scales
    raw[:, 208:210] = np.array([0.001], dtype=np.float16).view(np.uint8)
    expected = gguf.quants.dequantize(raw, GGMLQuantizationType.Q6_K)
    packed = _packed(raw, "Q6_K")
    step = np.repeat(packed.scale, 32, axis=1)
    assert np.all(np.abs(packed.dequantized() - expected) <= step / 2 + 1e-7)


def _product(matrix: PackedMatrix, x: np.ndarray, kernel: int) -> np.ndarray:
    out = np.zeros((x.shape[0], matrix.rows), dtype=np.float32)
    lib = cpu_decode.library()
    assert lib.specdec_qgemm(ctypes.byref(matrix.desc), x.ctypes.data, x.shape[0], out.ctypes.data, kernel, 2) == 0
    return out


def _matrices():
    """Rows that fill no whole last tile, 8-bit q (wide), offsets (Q4_K), and mixed zeros."""
    wide = _packed(_raw(RNG.standard_normal((40, 256)).astype(np.float32), "Q8_0"), "Q8_0")
    raw = RNG.integers(0, 256, size=(24, 144), dtype=np.uint8)
    raw[:, 0:4] = np.array([0.01, 0.002], dtype=np.float16).view(np.uint8)
    mins = _packed(raw, "Q4_K")
    fused = concat_rows([_packed(_raw(RNG.standard_normal((16, 256)).astype(np.float32), "Q5_0"), "Q5_0"), mins])
    return {"wide": wide, "offsets": mins, "fused": fused, "5-bit": _packed(_raw(RNG.standard_normal((24, 128)).astype(
        np.float32), "Q5_0"), "Q5_0"), "6-bit": _extremes(63, zero=32), "7-bit": _extremes(127, zero=64),
        "8-bit extremes": _extremes(255, zero=128), "8-bit with offsets": concat_rows([wide, mins])}


def _extremes(qmax: int, zero: int) -> PackedRows:
    """Random q in [0, qmax] with whole rows at both ends: the largest sums AVX2's 16-bit pairs meet."""
    q = RNG.integers(0, qmax + 1, size=(32, 256)).astype(np.uint8)
    q[0], q[1] = qmax, 0
    return PackedRows(q, RNG.uniform(0.001, 0.01, size=(32, 8)).astype(np.float32), None, zero)


@pytest.mark.skipif(cpu_decode.library() is None, reason="no C compiler for the native step")
@pytest.mark.parametrize("name", ["wide", "offsets", "fused", "5-bit", "6-bit", "7-bit", "8-bit extremes",
                                  "8-bit with offsets"])
def test_every_kernel_this_cpu_runs_gives_the_portable_kernels_numbers(name):
    rows = _matrices()[name]
    matrix = PackedMatrix(rows)
    x = RNG.standard_normal((13, matrix.cols)).astype(np.float32)  # up to three passes of 4 tokens and one
    x[0] = np.abs(x[0]) + 1  # activations of one sign: with q at both ends, the sums at their largest
    x[1] = -x[0]
    x[2] = np.resize(np.arange(-15.5, 16.5), matrix.cols)  # halves, where the rounding mode shows
    x[2, ::32] = 127.0  # each block's peak: the scale 1, so that the halves stay halves
    x[3] = 0.0  # blocks with no peak
    portable = _product(matrix, x, cpu_decode.QKERNELS["portable"])
    exact = x @ rows.dequantized().T
    rounded = [i for i in range(len(x)) if i != 2]  # the halves all round one way: that row is only compared between kernels
    assert np.abs(portable - exact)[rounded].max() <= 2e-2 * np.abs(exact)[rounded].max()  # 8-bit activations
    lib = cpu_decode.library()
    for kernel in ("avx2", "avx512_vnni"):
        code = cpu_decode.QKERNELS[kernel]
        if cpu_decode._probe_in_child(lib, code):
            for n in range(1, len(x) + 1):  # each pass's width: one tile, pairs, one pass of 5-8, fours and a rest
                assert np.array_equal(_product(matrix, x[:n].copy(), code), portable[:n]), (kernel, n)
    in_use = cpu_decode.QKERNELS[cpu_decode.qkernel()]
    one_by_one = np.concatenate([_product(matrix, x[i:i + 1].copy(), in_use) for i in range(len(x))])
    assert np.array_equal(one_by_one, portable)  # a token's row does not depend on its neighbours


def _cpu_lists(*flags: str) -> bool:
    try:
        listed = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return all(flag in listed for flag in flags)


@pytest.mark.skipif(cpu_decode.library() is None, reason="no C compiler for the native step")
@pytest.mark.parametrize("kernel, flags", [("avx2", ("avx2", "fma")),
                                           ("avx512_vnni", ("avx512f", "avx512bw", "avx512vl", "avx512_vnni"))])
def test_each_kernel_passes_its_probe_where_the_cpu_has_its_instructions(kernel, flags):
    """A kernel whose numbers drift from the portable one's is refused by its probe and the
    engine falls back to another: correct, but the test above would then compare nothing."""
    if not _cpu_lists(*flags):
        pytest.skip(f"the CPU lacks {kernel}'s instructions")
    assert cpu_decode._probe_in_child(cpu_decode.library(), cpu_decode.QKERNELS[kernel])


def test_fused_parts_of_different_zeros_share_one_zero_and_keep_their_values():
    """The kernels take one zero per matrix: Q5_0 (16), Q4_K (0) and Q8_0 (128) rows stacked
    are moved to 128 with their values exact."""
    parts = [_packed(_raw(RNG.standard_normal((16, 256)).astype(np.float32), "Q5_0"), "Q5_0"), _matrices()["offsets"],
             _packed(_raw(RNG.standard_normal((8, 256)).astype(np.float32), "Q8_0"), "Q8_0")]
    fused = concat_rows(parts)
    assert fused.zero == 128 and [p.zero for p in parts] == [16, 0, 128]
    assert np.array_equal(fused.dequantized(), np.concatenate([p.dequantized() for p in parts]))


def test_floats_are_packed_per_block_of_32_by_their_largest_magnitude():
    values = RNG.standard_normal((3, 64)).astype(np.float32)
    packed = from_floats(values)
    assert np.all(np.abs(packed.dequantized() - values) <= np.repeat(packed.scale, 32, axis=1) / 2 + 1e-7)


@pytest.fixture(scope="module")
def qwen2_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("packed")
    model = tiny_transformers_model("qwen2")
    model.save_pretrained(folder / "hf")
    return write_gguf(folder / "qwen2.gguf", model, GGMLQuantizationType.Q8_0), folder / "hf"


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    cache = model.new_cache(64)
    return model(ids, torch.arange(len(ids)), [Segment(cache, len(ids))])


needs_native = pytest.mark.skipif(cpu_decode.library() is None, reason="no C compiler for the native step")


@needs_native
def test_a_packed_gguf_model_gives_its_float_references_logits_within_activation_rounding(qwen2_files):
    file, _ = qwen2_files
    reference, packed = load_model(file), load_model(file, packed=True)
    ids = IDS[0]
    expected, got = _logits(reference, ids), _logits(packed, ids)
    assert packed.packed and all(p.is_meta for p in packed.model.layers[0].mlp.parameters())
    assert (got - expected).abs().max() <= 3e-2 * expected.abs().max()
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.9


@needs_native
def test_a_tokens_logits_are_the_same_in_one_pass_token_by_token_and_in_chunks(qwen2_files, monkeypatch):
    model = load_model(qwen2_files[0], packed=True)
    ids = IDS[0]
    whole = _logits(model, ids)
    cache = model.new_cache(64)
    stepped = []
    for i, token in enumerate(ids):
        stepped.append(model(token.view(1), torch.tensor([i]), [Segment(cache, 1)]))
        cache.keep_all()
    assert torch.equal(torch.cat(stepped), whole)
    monkeypatch.setattr(native, "MAX_TOKENS", 3)  # a prefill longer than one native call
    assert torch.equal(_logits(model, ids), whole)
    cache = model.new_cache(64)
    rows = model(ids, torch.arange(len(ids)), [Segment(cache, len(ids))], [9, 2])
    assert torch.equal(rows, whole[[9, 2]])


@needs_native
def test_every_kernel_this_cpu_runs_gives_a_pass_the_same_logits(qwen2_files):
    """The kernel chosen for the packed products also chooses a verify pass's attention (AVX-512
    with the VNNI kernel, AVX2 otherwise): a prompt and a token tree after it get the very logits
    under each. This checks the choice as a whole; the attention's own sums are held to each
    other in test_attention_cpu, since a last-bit difference there is rounded to 8 bits before
    the next product and would not show here."""
    model = load_model(qwen2_files[0], packed=True)
    lib, ids = cpu_decode.library(), IDS[0]
    parents = [-1, 0, 1, 0, 3, -1, 5, 6]  # two branches off the first node, and another root child
    tree = torch.eye(len(parents), dtype=torch.bool)
    for node, parent in enumerate(parents):
        if parent >= 0:
            tree[node] |= tree[parent]
    nodes = torch.tensor([7, 30, 41, 52, 63, 74, 85, 96])

    def logits() -> tuple[torch.Tensor, torch.Tensor]:
        cache = model.new_cache(64)
        prompt = model(ids, torch.arange(len(ids)), [Segment(cache, len(ids))])
        cache.keep_all()
        positions = len(ids) + tree.sum(1) - 1
        return prompt, model(nodes, positions, [Segment(cache, len(nodes), tree)])

    in_use = cpu_decode.QKERNELS[cpu_decode.qkernel()]
    expected = logits()
    tried = 0
    try:
        for kernel in ("avx2", "avx512_vnni"):
            code = cpu_decode.QKERNELS[kernel]
            if code != in_use and cpu_decode._probe_in_child(lib, code):
                lib.specdec_set_qkernel(code)
                got = logits()
                tried += 1
                assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), kernel
    finally:
        lib.specdec_set_qkernel(in_use)
    if not tried:
        pytest.skip("only one vector kernel runs on this CPU")


def test_packing_is_refused_with_a_clear_error_where_it_cannot_run(qwen2_files, tmp_path):
    with pytest.raises(CheckpointError, match="GGUF"):
        load_model(qwen2_files[1], packed=True)
    with pytest.raises(ValueError, match="made at load"):  # never a float model under the name
        quantize_target(load_model(qwen2_files[0]), "blocks")
    model = tiny_transformers_model("qwen3moe")
    model.save_pretrained(tmp_path / "hf")  # names its architecture
    moe = write_gguf(tmp_path / "moe.gguf", model)
    with pytest.raises(ConfigError, match="dense"):
        load_model(moe, packed=True)


def test_a_packed_linear_multiplies_as_its_float_weights_within_activation_rounding():
    from specdec.models.packed import PackedLinear

    lib = cpu_decode.library()
    if lib is None:
        pytest.skip("no C compiler for the native step")
    weight = torch.from_numpy(RNG.standard_normal((40, 96)).astype(np.float32))
    x = torch.from_numpy(RNG.standard_normal((2, 3, 96)).astype(np.float32))
    linear = PackedLinear(weight, lib)
    expected = x @ torch.from_numpy(from_floats(weight.numpy()).dequantized()).T  # the packed weights' own floats
    got = linear(x)
    assert got.shape == (2, 3, 40)
    assert (got - expected).abs().max() <= 2e-2 * expected.abs().max()


def test_a_packed_embedding_gives_the_rows_its_blocks_stand_for():
    from specdec.models.packed import PackedEmbedding

    rows = from_floats(RNG.standard_normal((37, 64)).astype(np.float32))  # rows past one tile of 16
    embedding = PackedEmbedding(PackedMatrix(rows))
    ids = torch.tensor([[0, 36, 17], [16, 15, 36]])
    assert torch.equal(embedding(ids), torch.from_numpy(rows.dequantized()[ids.numpy()]))
