/* One decode step of a decoder-only transformer on the CPU, for one sequence and one token.
 *
 * A small model's eager PyTorch step is mostly dispatch: a few hundred ops, each costing a
 * few microseconds of Python and ATen overhead, more than its arithmetic. This file runs the
 * whole step in one call: embedding, per layer RMSNorm, the fused qkv projection, optional
 * per-head q/k norms, rotate-half RoPE, the new key and value written in place into the
 * caller's cache, grouped-query attention over the cache, o_proj, and a dense SwiGLU MLP or a
 * softmax-top-k mixture of SwiGLU experts; then the final norm and the logits.
 *
 * Threads: one OpenMP parallel region per step. Matrix-vector products split their output
 * rows over the threads; attention splits its heads; the small serial pieces (norms, RoPE,
 * routing) run on one thread between barriers. The library links the OpenMP runtime that the
 * process already has (PyTorch's), so it shares torch's threads and thread count.
 *
 * Matrices are read where they lie, in either layout the model keeps (see Mat): no copies.
 * Sums run in another order than the eager step's, so logits agree with it within float
 * rounding, as any two matmul libraries do.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* y[r] = sum_c W[r * s_row + c * s_col] x[c] for r < rows, c < cols: s_col == 1 is the
 * checkpoint's [out, in] layout, s_row == 1 the input-major one. */
typedef struct {
    const float *w;
    int64_t rows, cols, s_row, s_col;
} Mat;

typedef struct {
    const float *attn_norm, *post_norm; /* [H] */
    Mat qkv;                            /* rows (Hq + 2 Hkv) * D */
    const float *qkv_bias;              /* or NULL */
    const float *qk_norm;               /* [(Hq + Hkv) * D] per-head q/k norm weights, or NULL */
    Mat o;
    const float *o_bias;  /* or NULL */
    int64_t num_experts;  /* 0: a dense MLP in gate/up/down */
    Mat router;           /* [E, H] */
    const float *router_bias; /* or NULL */
    Mat gate, up, down;   /* expert 0's (or the dense MLP's) */
    int64_t gate_up_expert_stride, down_expert_stride; /* elements from one expert to the next */
} Layer;

typedef struct {
    int64_t hidden, num_layers, heads, kv_heads, head_dim, vocab, intermediate, top_k, renormalize;
    float eps, attn_scale, rope_factor;
    const float *embed;      /* [V, H] */
    const float *final_norm; /* [H] */
    Mat lm_head;
    const float *inv_freq;   /* [D / 2] */
    const Layer *layers;
    const int32_t *capture;  /* [num_layers]: 1 copies that layer's input to capture_out */
} Model;

static inline float dot(const float *a, const float *b, int64_t n) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

/* The rows [r0, r1) of y = W x (+ bias); each thread calls it with its own range. */
static void gemv_rows(const Mat *m, const float *x, float *y, const float *bias, int64_t r0, int64_t r1) {
    if (m->s_col == 1) {
        int64_t r = r0;
        for (; r + 4 <= r1; r += 4) { /* four rows share each load of x */
            const float *w0 = m->w + r * m->s_row, *w1 = w0 + m->s_row, *w2 = w1 + m->s_row, *w3 = w2 + m->s_row;
            float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
            for (int64_t c = 0; c < m->cols; c++) {
                a0 += w0[c] * x[c];
                a1 += w1[c] * x[c];
                a2 += w2[c] * x[c];
                a3 += w3[c] * x[c];
            }
            y[r] = a0, y[r + 1] = a1, y[r + 2] = a2, y[r + 3] = a3;
        }
        for (; r < r1; r++) y[r] = dot(m->w + r * m->s_row, x, m->cols);
    } else { /* input-major: accumulate column by column over this thread's contiguous rows */
        float *out = y + r0;
        const int64_t n = r1 - r0;
        memset(out, 0, (size_t)n * sizeof(float));
        int64_t c = 0;
        for (; c + 4 <= m->cols; c += 4) {
            const float *w0 = m->w + c * m->s_col + r0, *w1 = w0 + m->s_col, *w2 = w1 + m->s_col, *w3 = w2 + m->s_col;
            const float x0 = x[c], x1 = x[c + 1], x2 = x[c + 2], x3 = x[c + 3];
#pragma omp simd
            for (int64_t i = 0; i < n; i++) out[i] += x0 * w0[i] + x1 * w1[i] + x2 * w2[i] + x3 * w3[i];
        }
        for (; c < m->cols; c++) {
            const float *w0 = m->w + c * m->s_col + r0;
            const float x0 = x[c];
#pragma omp simd
            for (int64_t i = 0; i < n; i++) out[i] += x0 * w0[i];
        }
    }
    if (bias)
        for (int64_t r = r0; r < r1; r++) y[r] += bias[r];
}

/* This thread's share of `rows`, in blocks of 16 so that vector loops stay aligned. */
static void share(int64_t rows, int64_t *r0, int64_t *r1) {
    const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t blocks = (rows + 15) / 16;
    *r0 = blocks * me / threads * 16;
    *r1 = blocks * (me + 1) / threads * 16;
    if (*r0 > rows) *r0 = rows;
    if (*r1 > rows) *r1 = rows;
}

static void gemv(const Mat *m, const float *x, float *y, const float *bias) {
    int64_t r0, r1;
    share(m->rows, &r0, &r1);
    if (r0 < r1) gemv_rows(m, x, y, bias, r0, r1);
}

static Mat expert(const Mat *m, int64_t index, int64_t stride) {
    Mat e = *m;
    e.w += index * stride;
    return e;
}

static void rms_norm(const float *x, const float *weight, float *out, int64_t n, float eps) {
    float squares = 0.0f;
    for (int64_t i = 0; i < n; i++) squares += x[i] * x[i];
    const float scale = 1.0f / sqrtf(squares / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * weight[i];
}

static void rope(float *head, const float *cos_, const float *sin_, int64_t dim) {
    const int64_t half = dim / 2;
    for (int64_t i = 0; i < half; i++) {
        const float a = head[i], b = head[i + half];
        head[i] = a * cos_[i] - b * sin_[i];
        head[i + half] = b * cos_[i + half] + a * sin_[i + half];
    }
}

static inline float silu(float v) { return v / (1.0f + expf(-v)); }

/* Softmax over the experts' logits, the top k (ties to the lower index), renormalised. */
static void route(const Model *m, const float *logits, int64_t experts, int64_t *ids, float *weights) {
    float peak = logits[0], total = 0.0f, probs[256];
    for (int64_t e = 1; e < experts; e++) peak = logits[e] > peak ? logits[e] : peak;
    for (int64_t e = 0; e < experts; e++) total += probs[e] = expf(logits[e] - peak);
    for (int64_t e = 0; e < experts; e++) probs[e] /= total;
    float chosen = 0.0f;
    for (int64_t k = 0; k < m->top_k; k++) {
        int64_t best = -1;
        for (int64_t e = 0; e < experts; e++) {
            int taken = 0;
            for (int64_t j = 0; j < k; j++) taken |= ids[j] == e;
            if (!taken && (best < 0 || probs[e] > probs[best])) best = e;
        }
        ids[k] = best, weights[k] = probs[best], chosen += probs[best];
    }
    if (m->renormalize)
        for (int64_t k = 0; k < m->top_k; k++) weights[k] /= chosen;
}

/* One query head over the cache's first `count` positions of its key/value head. */
static void attend_head(const float *q, const float *keys, const float *values, int64_t count, int64_t dim,
                        float scale, float *scores, float *out) {
    float peak = -INFINITY, total = 0.0f;
    for (int64_t j = 0; j < count; j++) {
        const float s = dot(q, keys + j * dim, dim) * scale;
        scores[j] = s;
        peak = s > peak ? s : peak;
    }
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < count; j++) total += scores[j] = expf(scores[j] - peak);
    memset(out, 0, (size_t)dim * sizeof(float));
    for (int64_t j = 0; j < count; j++) {
        const float p = scores[j] / total;
        const float *v = values + j * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; d++) out[d] += p * v[d];
    }
}

int64_t specdec_abi_version(void) { return 2; }

/* keys/values: the sequence's cache [L, 1, Hkv, capacity, D]; the new token goes to row
 * `length`, and attention reads rows [0, length]. logits [V]; ids_out [layers with experts, k];
 * capture_out [captured layers * H] or NULL; threads: the caller's (torch's) thread count,
 * which is the calling thread's own setting. Returns 0, or -1 when scratch memory is lacking. */
int specdec_decode(const Model *m, int64_t token, int64_t position, float *keys, float *values, int64_t capacity,
                   int64_t length, float *logits, int64_t *ids_out, float *capture_out, int threads) {
    const int64_t H = m->hidden, D = m->head_dim, Hq = m->heads, Hkv = m->kv_heads;
    const int64_t I = m->intermediate; /* the widest layer's */
    const int64_t count = length + 1, kv_rows = Hkv * capacity * D, group = Hq / Hkv;
    const int64_t k_max = m->top_k > 0 ? m->top_k : 1;
    const size_t floats = (size_t)(3 * H + (Hq + 2 * Hkv) * D + Hq * D + 2 * D + 2 * I * k_max + H * k_max + 256 +
                                   Hq * count);
    float *scratch = malloc(floats * sizeof(float));
    if (!scratch) return -1;
    float *x = scratch, *normed = x + H, *h = normed + H, *qkv = h + H, *att = qkv + (Hq + 2 * Hkv) * D;
    float *cos_ = att + Hq * D, *sin_ = cos_ + D, *act = sin_ + D, *expert_out = act + 2 * I * k_max;
    float *router_logits = expert_out + H * k_max, *scores = router_logits + 256;
    int64_t ids[64];
    float weights[64];

    memcpy(x, m->embed + token * H, (size_t)H * sizeof(float));
    for (int64_t i = 0; i < D / 2; i++) {
        const float angle = (float)position * m->inv_freq[i];
        cos_[i] = cos_[i + D / 2] = cosf(angle) * m->rope_factor;
        sin_[i] = sin_[i + D / 2] = sinf(angle) * m->rope_factor;
    }
    int64_t moe_layer = 0, captured = 0;
#pragma omp parallel num_threads(threads)
    {
    for (int64_t l = 0; l < m->num_layers; l++) {
        const Layer *layer = m->layers + l;
        float *layer_keys = keys + l * kv_rows, *layer_values = values + l * kv_rows;
#pragma omp single
        {
            if (capture_out && m->capture[l]) memcpy(capture_out + H * captured++, x, (size_t)H * sizeof(float));
            rms_norm(x, layer->attn_norm, normed, H, m->eps);
        }
        gemv(&layer->qkv, normed, qkv, layer->qkv_bias);
#pragma omp barrier
#pragma omp single
        {
            for (int64_t head = 0; head < Hq + Hkv; head++) {
                float *vec = qkv + head * D;
                if (layer->qk_norm) rms_norm(vec, layer->qk_norm + head * D, vec, D, m->eps);
                rope(vec, cos_, sin_, D);
            }
            for (int64_t kv = 0; kv < Hkv; kv++) {
                memcpy(layer_keys + (kv * capacity + length) * D, qkv + (Hq + kv) * D, (size_t)D * sizeof(float));
                memcpy(layer_values + (kv * capacity + length) * D, qkv + (Hq + Hkv + kv) * D, (size_t)D * sizeof(float));
            }
        }
#pragma omp for schedule(static)
        for (int64_t head = 0; head < Hq; head++) {
            const int64_t kv = head / group;
            attend_head(qkv + head * D, layer_keys + kv * capacity * D, layer_values + kv * capacity * D, count, D,
                        m->attn_scale, scores + head * count, att + head * D);
        }
        gemv(&layer->o, att, h, layer->o_bias);
#pragma omp barrier
#pragma omp single
        {
            for (int64_t i = 0; i < H; i++) x[i] += h[i];
            rms_norm(x, layer->post_norm, normed, H, m->eps);
            if (layer->num_experts) {
                for (int64_t e = 0; e < layer->num_experts; e++)
                    router_logits[e] = dot(layer->router.w + e * layer->router.s_row, normed, H) +
                                       (layer->router_bias ? layer->router_bias[e] : 0.0f);
                route(m, router_logits, layer->num_experts, ids, weights);
                memcpy(ids_out + m->top_k * moe_layer++, ids, (size_t)m->top_k * sizeof(int64_t));
            } else {
                ids[0] = 0, weights[0] = 1.0f;
            }
        }
        const int64_t slots = layer->num_experts ? m->top_k : 1;
        for (int64_t s = 0; s < slots; s++) {
            const Mat gate = expert(&layer->gate, ids[s], layer->gate_up_expert_stride);
            const Mat up = expert(&layer->up, ids[s], layer->gate_up_expert_stride);
            const Mat down = expert(&layer->down, ids[s], layer->down_expert_stride);
            float *g = act + 2 * I * s, *u = g + I;
            int64_t r0, r1;
            share(gate.rows, &r0, &r1);
            if (r0 < r1) {
                gemv_rows(&gate, normed, g, NULL, r0, r1);
                gemv_rows(&up, normed, u, NULL, r0, r1);
                for (int64_t r = r0; r < r1; r++) g[r] = silu(g[r]) * u[r];
            }
#pragma omp barrier
            gemv(&down, g, expert_out + H * s, NULL);
        }
#pragma omp barrier
#pragma omp single
        for (int64_t i = 0; i < H; i++) {
            float sum = expert_out[i] * weights[0];
            for (int64_t s = 1; s < slots; s++) sum += expert_out[H * s + i] * weights[s];
            x[i] += sum;
        }
    }
#pragma omp single
    rms_norm(x, m->final_norm, normed, H, m->eps);
    gemv(&m->lm_head, normed, logits, NULL);
    }
    free(scratch);
    return 0;
}
