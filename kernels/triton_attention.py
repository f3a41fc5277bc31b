"""Tree attention in Triton, split over the cache length (flash-decoding), with GQA.

Each program takes one (sequence, query head, split of the keys) and all of that sequence's
new tokens, runs an online softmax over its split, and leaves a partial (max, sum, output);
the partials are merged by log-sum-exp. Key j of sequence b is visible to new token i when
j < cache_lens[b] (the committed prefix), or j = cache_lens[b] + t with tree_mask[b, i, t]
(t an ancestor of i, or i itself) and t < q_lens[b].
"""

import math

import torch
import triton
import triton.language as tl

# B = sequences, Hq/Hkv = heads, Tq = new tokens, S = cache capacity, D = head dim


@triton.jit
def _tree_attention_kernel(q_ptr,  # [B, Hq, Tq, D]
                           k_ptr, v_ptr,  # [B, Hkv, S, D]
                           mask_ptr,  # [B, Tq, Tq] int8
                           cache_lens_ptr, q_lens_ptr,  # [B] int32
                           part_out_ptr,  # [B, Hq, SPLITS, Tq, D] fp32
                           part_lse_ptr,  # [B, Hq, SPLITS, Tq] fp32 (max and sum folded into a log-sum-exp)
                           num_heads, group, num_new, keys_per_split, scale,
                           sq_b, sq_h, sq_t, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
                           HAS_MASK: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_S: tl.constexpr,
                           HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr):
    bh, split = tl.program_id(0), tl.program_id(1)
    b, h = bh // num_heads, bh % num_heads
    kv_h = h // group
    cache_len = tl.load(cache_lens_ptr + b)
    q_len = tl.load(q_lens_ptr + b)
    total = cache_len + q_len
    offs_q = tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ok = offs_q < q_len
    q = tl.load(q_ptr + b * sq_b + h * sq_h + offs_q[:, None] * sq_t + offs_d[None, :], mask=q_ok[:, None], other=0.0)
    q = q.to(tl.float32) * scale
    m = tl.full((BLOCK_Q,), -float("inf"), dtype=tl.float32)
    denom = tl.zeros((BLOCK_Q,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_Q, HEAD_DIM), dtype=tl.float32)
    start = split * keys_per_split
    stop = tl.minimum(start + keys_per_split, total)
    for s0 in range(start, stop, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        s_ok = offs_s < stop
        k = tl.load(k_ptr + b * sk_b + kv_h * sk_h + offs_s[:, None] * sk_s + offs_d[None, :], mask=s_ok[:, None], other=0.0)
        v = tl.load(v_ptr + b * sv_b + kv_h * sv_h + offs_s[:, None] * sv_s + offs_d[None, :], mask=s_ok[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")  # [BLOCK_Q, BLOCK_S]
        tree_pos = offs_s - cache_len
        in_tree = (tree_pos >= 0) & s_ok
        if HAS_MASK:
            allowed = tl.load(mask_ptr + b * num_new * num_new + offs_q[:, None] * num_new + tree_pos[None, :],
                              mask=q_ok[:, None] & in_tree[None, :], other=0)
            tree_ok = allowed != 0
        else:
            tree_ok = tree_pos[None, :] <= offs_q[:, None]
        visible = s_ok[None, :] & ((tree_pos[None, :] < 0) | (in_tree[None, :] & tree_ok)) & q_ok[:, None]
        scores = tl.where(visible, scores, -float("inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        p = tl.exp(scores - m_safe[:, None])
        alpha = tl.exp(m - m_safe)
        denom = denom * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        m = m_new
    base = (bh * SPLITS + split) * num_new
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    lse = tl.where(denom > 0, m + tl.log(tl.where(denom > 0, denom, 1.0)), -float("inf"))
    tl.store(part_out_ptr + (base + offs_q[:, None]) * HEAD_DIM + offs_d[None, :], out, mask=q_ok[:, None] & (offs_q[:, None] < num_new))
    tl.store(part_lse_ptr + base + offs_q, lse, mask=q_ok & (offs_q < num_new))


def tree_attention_triton(q, k_cache, v_cache, cache_lens, tree_mask=None, scale=None, q_lens=None, splits=None):
    """Same contract as specdec_kernels.attention_torch.tree_attention_torch; q_lens [B] allows ragged new tokens."""
    assert q.ndim == 4 and k_cache.ndim == 4 and k_cache.shape == v_cache.shape, "q [B,Hq,Tq,D], k/v [B,Hkv,S,D]"
    batch, num_heads, num_new, head_dim = q.shape
    num_kv = k_cache.shape[1]
    assert num_heads % num_kv == 0 and head_dim == triton.next_power_of_2(head_dim) and head_dim >= 16
    device = q.device
    cache_lens = torch.as_tensor(cache_lens, dtype=torch.int32, device=device).reshape(batch)
    q_lens = (torch.full((batch,), num_new, dtype=torch.int32, device=device) if q_lens is None
              else torch.as_tensor(q_lens, dtype=torch.int32, device=device).reshape(batch))
    max_total = int((cache_lens + q_lens).max())
    splits = splits or max(1, min(16, triton.cdiv(max_total, 256)))
    keys_per_split = triton.cdiv(max_total, splits)
    mask = (tree_mask.to(torch.int8).contiguous() if tree_mask is not None
            else torch.zeros(1, dtype=torch.int8, device=device))
    part_out = torch.empty(batch, num_heads, splits, num_new, head_dim, dtype=torch.float32, device=device)
    part_lse = torch.full((batch, num_heads, splits, num_new), -float("inf"), dtype=torch.float32, device=device)
    q = q.contiguous()
    block_q = max(16, triton.next_power_of_2(num_new))
    _tree_attention_kernel[(batch * num_heads, splits)](
        q, k_cache, v_cache, mask, cache_lens, q_lens, part_out, part_lse, num_heads, num_heads // num_kv, num_new,
        keys_per_split, scale if scale is not None else 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HAS_MASK=tree_mask is not None, BLOCK_Q=block_q, BLOCK_S=32, HEAD_DIM=head_dim, SPLITS=splits)
    weights = torch.softmax(part_lse, dim=2).nan_to_num(0.0)  # merge the splits by log-sum-exp
    return (weights.unsqueeze(-1) * part_out).sum(dim=2).to(q.dtype)
