"""The native causal attention for prefill agrees with exact attention, and steps aside where it
does not apply."""

import ctypes

import pytest
import torch
import torch.nn.functional as F

import specdec_kernels as kernels
from specdec_kernels import attention_cpu, cpu_decode

needs_native = pytest.mark.skipif(cpu_decode.library() is None, reason="no C compiler for the native library")


def exact(q, k_cache, v_cache, prefix, scale):
    """Float64 attention of q's n tokens at positions prefix.. over the cache's first prefix + n rows."""
    n = q.shape[2]
    visible = torch.ones(n, prefix + n, dtype=torch.bool)
    visible[:, prefix:] = torch.ones(n, n, dtype=torch.bool).tril()
    keys, values = k_cache[:, :, : prefix + n].double(), v_cache[:, :, : prefix + n].double()
    return F.scaled_dot_product_attention(q.double(), keys, values, attn_mask=visible, scale=scale,
                                          enable_gqa=True).float()


def projected(n, heads, kv_heads, dim, capacity, generator):
    """q as the model hands it over (a [1, Hq, n, D] view of the fused qkv rows) and a cache."""
    qkv = torch.randn(n, heads + 2 * kv_heads, dim, generator=generator) * 2
    q = qkv[:, :heads].transpose(0, 1)[None]
    k = torch.randn(1, kv_heads, capacity, dim, generator=generator)
    v = torch.randn(1, kv_heads, capacity, dim, generator=generator)
    return q, k, v


@needs_native
@pytest.mark.parametrize("heads,kv_heads,dim,n,prefix", [
    (8, 4, 32, 300, 0),     # a prompt's prefill, the shipped target's heads
    (8, 4, 32, 70, 1000),   # a long new tail after a prompt-cache hit
    (6, 2, 64, 130, 17),    # rows that do not fill the score tiles
    (8, 8, 24, 65, 0),      # no grouping, a width that is not a multiple of 32
    (4, 1, 128, 49, 3),     # wide heads
])
def test_agrees_with_exact_attention(heads, kv_heads, dim, n, prefix):
    g = torch.Generator().manual_seed(n + prefix)
    q, k, v = projected(n, heads, kv_heads, dim, prefix + n + 9, g)
    out = attention_cpu.causal_attention_native(q, k, v, (prefix,), dim ** -0.5)
    assert out.shape == (1, heads, n, dim)
    assert torch.allclose(out, exact(q, k, v, prefix, dim ** -0.5), atol=2e-5, rtol=1e-4)
    # the o_proj input is a free view of what the kernel wrote
    assert out[0].transpose(0, 1).is_contiguous()


@needs_native
def test_each_sequence_of_a_batch_after_its_own_prefix():
    g = torch.Generator().manual_seed(1)
    q, k, v = projected(64, 4, 2, 32, 200, g)
    q2, k2, v2 = projected(64, 4, 2, 32, 200, g)
    out = attention_cpu.causal_attention_native(torch.cat([q, q2]), torch.cat([k, k2]), torch.cat([v, v2]), (0, 90))
    assert torch.allclose(out[:1], exact(q, k, v, 0, None), atol=2e-5, rtol=1e-4)
    assert torch.allclose(out[1:], exact(q2, k2, v2, 90, None), atol=2e-5, rtol=1e-4)


@needs_native
def test_public_entry_takes_long_causal_runs_only(monkeypatch):
    g = torch.Generator().manual_seed(2)
    q, k, v = projected(attention_cpu.MIN_TOKENS, 8, 4, 32, 400, g)
    calls = []
    real = attention_cpu.causal_attention_native
    monkeypatch.setattr(kernels, "causal_attention_native", lambda *a: calls.append(a[0].shape[2]) or real(*a))
    assert torch.allclose(kernels.tree_attention(q, k, v, (100,)), exact(q, k, v, 100, None), atol=2e-5, rtol=1e-4)
    tree = torch.ones(1, q.shape[2], q.shape[2], dtype=torch.bool).tril()
    kernels.tree_attention(q, k, v, (100,), tree)  # a tree (even a causal one) stays on PyTorch
    assert calls == [attention_cpu.MIN_TOKENS]


def test_steps_aside_where_it_does_not_apply(monkeypatch):
    g = torch.Generator().manual_seed(3)
    q, k, v = projected(attention_cpu.MIN_TOKENS, 8, 4, 32, 200, g)
    assert attention_cpu.causal_attention_native(q[:, :, :-1], k, v, (0,)) is None  # too short to pay
    assert attention_cpu.causal_attention_native(q.double(), k.double(), v.double(), (0,)) is None
    q12, k12, v12 = projected(attention_cpu.MIN_TOKENS, 4, 2, 12, 200, g)
    assert attention_cpu.causal_attention_native(q12, k12, v12, (0,)) is None  # 12 wide: not in eights
    monkeypatch.setenv("SPECDEC_NATIVE", "0")
    assert attention_cpu.causal_attention_native(q, k, v, (0,)) is None


@needs_native
def test_a_run_past_the_cache_is_refused():
    g = torch.Generator().manual_seed(4)
    q, k, v = projected(64, 4, 2, 32, 100, g)
    with pytest.raises(ValueError, match="do not fit"):
        attention_cpu.causal_attention_native(q, k, v, (50,))


def _avx512_runs() -> bool:
    """Whether this CPU runs the AVX-512 attention: the VNNI kernel's probe, whose choice enables it."""
    lib = cpu_decode.library()
    return lib is not None and cpu_decode._probe_in_child(lib, cpu_decode.QKERNELS["avx512_vnni"])


def _attend_rows(q, counts, keys, values, length, scale, avx512: bool) -> torch.Tensor:
    lib = cpu_decode.library()
    lib.specdec_attend_rows.restype = ctypes.c_int
    lib.specdec_attend_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_float,
                                        ctypes.c_int, ctypes.c_void_p]
    out = torch.empty_like(q)
    count = torch.tensor(counts, dtype=torch.int64)
    status = lib.specdec_attend_rows(q.data_ptr(), len(q), count.data_ptr(), keys.data_ptr(), values.data_ptr(),
                                     length, q.shape[1], scale, int(avx512), out.data_ptr())
    assert status == 0
    return out


@pytest.mark.skipif(cpu_decode.build() != "avx2" or not _avx512_runs(), reason="no AVX-512 attention on this CPU")
@pytest.mark.parametrize("dim", [16, 64, 128])
@pytest.mark.parametrize("rows", [1, 7, 8, 13, 28])
def test_the_avx512_decode_attention_gives_the_avx2_passes_very_numbers(dim, rows):
    """A verify pass's rows (the group's heads of a few tokens, each seeing its own count of new
    keys) must get the same numbers from the AVX-512 attention as from AVX2's, bit for bit: on a
    VNNI machine a decode step's rows keep AVX2's and a verify pass's take AVX-512's, and a
    token's numbers must not depend on which, or a verify pass would stop equalling plain decoding."""
    generator = torch.Generator().manual_seed(dim * 100 + rows)
    length = 201  # committed keys: chunks of 64 and a ragged last one
    counts = [length + 1 + r % 5 for r in range(rows)]
    q = torch.randn(rows, dim, generator=generator) * 2
    keys = torch.randn(length + 8, dim, generator=generator)
    values = torch.randn(length + 8, dim, generator=generator)
    scale = dim ** -0.5
    wide = _attend_rows(q, counts, keys, values, length, scale, avx512=True)
    assert torch.equal(wide, _attend_rows(q, counts, keys, values, length, scale, avx512=False))
    for r, count in enumerate(counts):  # and both are attention
        weights = torch.softmax(q[r].double() @ keys[:count].double().T * scale, dim=-1)
        assert torch.allclose(wide[r].double(), weights @ values[:count].double(), atol=1e-5, rtol=1e-4)
