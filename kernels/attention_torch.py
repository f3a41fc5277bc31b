"""PyTorch tree attention: new tokens attend to their sequence's cached prefix and their tree ancestors."""

import torch
import torch.nn.functional as F

# B = sequences, Tq = new tokens per sequence, S = cache capacity, Hq/Hkv = query/kv heads, D = head dim


def tree_attention_torch(q, k_cache, v_cache, cache_lens, tree_mask=None, scale=None, *, sinks=None, window: int = 0,
                         positions=None):
    """Attention of new (tree) tokens over a KV cache that already holds their own keys.

    q        [B, Hq, Tq, D]   queries of the new tokens
    k_cache  [B, Hkv, S, D]   keys: positions < cache_lens[b] are the committed prefix, the
    v_cache  [B, Hkv, S, D]   next Tq positions hold the new tokens' keys and values in order
    cache_lens [B] ints       committed prefix length of each sequence
    tree_mask [B, Tq, Tq] bool or None; mask[b, i, j] is True when new token j is an ancestor of
              (or is) new token i. None means plain causal order among the new tokens.
    sinks    [Hq] or None      a learned logit per head that joins every softmax and takes its
                              share of the weight, with no value (GPT-OSS)
    window   int              > 0: a key is visible only within `window` positions before the
                              query (query position - key position < window)
    positions [B, Tq] or None the new tokens' positions (tree nodes: prefix + depth); needed with
                              a window, default prefix + index
    Returns [B, Hq, Tq, D]. Grouped-query attention when Hq is a multiple of Hkv.
    """
    if sinks is not None or window:
        return _with_sinks_or_window(q, k_cache, v_cache, cache_lens, tree_mask, scale, sinks, window, positions)
    batch, _, num_new, _ = q.shape
    outputs = []
    for b in range(batch):
        prefix = int(cache_lens[b])
        keys = k_cache[b : b + 1, :, : prefix + num_new]
        values = v_cache[b : b + 1, :, : prefix + num_new]
        if prefix == 0 and tree_mask is None and num_new > 1:
            # A prompt's first chunk: plain causal, which lets the flash kernel skip the masked
            # half of the scores (a boolean mask makes it compute all of them).
            outputs.append(F.scaled_dot_product_attention(q[b : b + 1], keys, values, is_causal=True, scale=scale,
                                                          enable_gqa=True))
            continue
        mask = _visible(prefix, num_new, None if tree_mask is None else tree_mask[b], q.device)
        outputs.append(
            F.scaled_dot_product_attention(
                q[b : b + 1], keys, values, attn_mask=mask, scale=scale, enable_gqa=True
            )
        )
    return torch.cat(outputs, dim=0)


def _with_sinks_or_window(q, k_cache, v_cache, cache_lens, tree_mask, scale, sinks, window: int, positions):
    """The same attention written out: scores, window and tree masks, a sink column in the softmax."""
    batch, heads, num_new, dim = q.shape
    scale = dim ** -0.5 if scale is None else scale
    outputs = []
    for b in range(batch):
        prefix = int(cache_lens[b])
        keys = k_cache[b, :, : prefix + num_new].repeat_interleave(heads // k_cache.shape[1], dim=0)
        values = v_cache[b, :, : prefix + num_new].repeat_interleave(heads // v_cache.shape[1], dim=0)
        scores = (q[b] @ keys.transpose(-1, -2)).float() * scale  # [Hq, Tq, prefix + Tq]
        visible = _visible(prefix, num_new, None if tree_mask is None else tree_mask[b], q.device)
        if visible is None:
            visible = torch.ones(num_new, prefix + num_new, dtype=torch.bool, device=q.device)
        if window:
            query_pos = positions[b] if positions is not None else torch.arange(prefix, prefix + num_new, device=q.device)
            key_pos = torch.cat([torch.arange(prefix, device=q.device), query_pos])
            visible = visible & (query_pos[:, None] - key_pos[None, :] < window)
        scores = scores.masked_fill(~visible, float("-inf"))
        if sinks is not None:
            sink = sinks.float().view(heads, 1, 1).expand(heads, num_new, 1)
            weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            weights = torch.softmax(scores, dim=-1)
        outputs.append((weights.to(values.dtype) @ values)[None])
    return torch.cat(outputs, dim=0)


def _visible(prefix: int, num_new: int, tree_mask, device):
    """Boolean [Tq, prefix + Tq] visibility, or None when every key is visible (one new token)."""
    if tree_mask is None:
        if num_new == 1:
            return None
        tree_mask = torch.ones(num_new, num_new, dtype=torch.bool, device=device).tril_()
    mask = torch.ones(num_new, prefix + num_new, dtype=torch.bool, device=device)
    mask[:, prefix:] = tree_mask
    return mask
