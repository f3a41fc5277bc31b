/* One step of a decoder-only transformer on the CPU for the new tokens of one or more
 * sequences: decode steps, verify passes over token trees, and short prompt chunks riding along.
 * Several sequences share one call so that each weight row is read once for all their tokens:
 * on a memory-bound CPU that, not the arithmetic, is what a batched step costs.
 *
 * A small model's eager PyTorch step is mostly dispatch: a few hundred ops, each costing a
 * few microseconds of Python and ATen overhead, more than its arithmetic. This file runs the
 * whole step in one call: embedding, per layer RMSNorm, the fused qkv projection, optional
 * per-head q/k norms, rotate-half RoPE, the new key and value written in place into the
 * caller's cache, grouped-query attention over the cache, o_proj, and a dense SwiGLU MLP or a
 * softmax-top-k mixture of SwiGLU experts; then the final norm and the logits.
 *
 * Threads: one OpenMP parallel region per step. Matrix products split their output rows over
 * the threads (each weight row read once for all the tokens); attention splits its passes
 * (the group's heads of a few tokens, over one kv head); several tokens' experts run expert by expert over their gathered tokens; the
 * small serial pieces (norms, RoPE, routing) run on one thread between barriers. The library links the OpenMP runtime that the
 * process already has (PyTorch's), so it shares torch's threads and thread count.
 *
 * Matrices are read where they lie, in either layout the model keeps (see Mat), or from a bf16
 * copy at the same strides where bf16 holds their values exactly. Sums run in another order
 * than the eager step's, so logits agree with it within float rounding, as any two matmul
 * libraries do; but in the AVX2 build each sum's order is fixed per token, so a token's logits
 * are bit for bit the same whatever else shares its step (cpu_decode_vector.h).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* glibc's vector expf (libmvec), which the compiler calls from vectorised loops; glibc declares
 * it only under -ffast-math, whose reassociation this file does not want. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__FAST_MATH__) && !defined(SPECDEC_NO_MVEC)
__attribute__((__simd__("notinbranch"))) float expf(float);
#endif

#include "cpu_quant.h" /* integer products on 8-bit weight blocks */

/* y[r] = sum_c W[r * s_row + c * s_col] x[c] for r < rows, c < cols: s_col == 1 is the
 * checkpoint's [out, in] layout, s_row == 1 the input-major one. */
typedef struct {
    const float *w;
    int64_t rows, cols, s_row, s_col;
    const uint16_t *half; /* the same values in bf16 at the same strides, or NULL (see load_weights) */
    const QMat *quant;    /* or the matrix packed in 8-bit blocks (w NULL): products in integers */
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
    const float *embed;      /* [V, H], or NULL with embed_quant */
    const QMat *embed_quant; /* the embedding packed in 8-bit blocks, or NULL */
    const float *final_norm; /* [H] */
    Mat lm_head;
    const float *inv_freq;   /* [D / 2] */
    const Layer *layers;
    const int32_t *capture;  /* [capture_count]: the layer whose input goes to each slot of capture_out
                              * (num_layers: the last layer's output, before the final norm) */
    int64_t capture_count;   /* slots (a layer may fill several, as a tiny model's head asks) */
} Model;

/* One sequence's part of a step: its n new tokens (contiguous in the step, in sequence order)
 * go after the `length` committed rows of its cache [L, 1, Hkv, capacity, D]. mask [n, n]:
 * token t sees new token j where mask[t * n + j] (ancestor-or-self in a tree), or NULL for
 * causal. */
typedef struct {
    float *keys, *values;
    int64_t capacity, length, n;
    const uint8_t *mask;
} Seq;

static inline float dot(const float *a, const float *b, int64_t n) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

/* Attention goes in passes over one kv head's keys and values, each taking the group's heads of
 * as many consecutive tokens (up to PASS_TOKENS) as keep the pass's rows of scores within about
 * half of L2: the keys and values then stream through once a pass, not once a row. A row of
 * scores has room for its keys rounded up to KEY_CHUNK (the chunks the keys are scored in). */
#define PASS_SCORES (64 * 1024)
#define PASS_TOKENS 32
#define KEY_CHUNK 64

/* One query row of a pass: its own row of scores, visible new keys and length. */
typedef struct {
    const float *q;
    const uint8_t *visible; /* which of the new keys [length, count) it sees; NULL: all */
    int64_t count;          /* keys it attends over: the committed ones and the new ones up to its own */
    float *scores;          /* room for count rounded up to KEY_CHUNK */
    float *out;             /* the running sum of weighted values, then the output */
    float total;            /* the running sum of the weights */
} AttendRow;

#include "cpu_decode_vector.h" /* the AVX2 products and attention, summed in a fixed order */
#include "cpu_decode_avx512.h" /* the same attention's numbers, sixteen lanes wide */

/* The rows [r0, r1) of Y = X W^T (+ bias) for n input rows X [n, ldx] into Y [n, ldy]; each
 * thread calls it with its own range. Weight rows are read once for all n inputs. */
static void gemm_rows(const Mat *m, const float *X, int64_t ldx, float *Y, int64_t ldy, int64_t n, const float *bias,
                      int64_t r0, int64_t r1) {
    if (m->quant) {
        qgemm_rows(m->quant, X, ldx, Y, ldy, n, bias, r0, r1);
        return;
    }
#if defined(__AVX2__) && defined(__FMA__)
    if (m->s_col == 1 && m->cols % 8 == 0)
        gemm_output_major(m, X, ldx, Y, ldy, n, r0, r1);
    else if (m->s_row == 1)
        gemm_input_major(m, X, ldx, Y, ldy, n, r0, r1);
    else
#endif
    if (m->s_col == 1) {
        int64_t r = r0;
        for (; r + 4 <= r1; r += 4) { /* four rows share each load of x */
            const float *w0 = m->w + r * m->s_row, *w1 = w0 + m->s_row, *w2 = w1 + m->s_row, *w3 = w2 + m->s_row;
            for (int64_t t = 0; t < n; t++) {
                const float *x = X + t * ldx;
                float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
                for (int64_t c = 0; c < m->cols; c++) {
                    a0 += w0[c] * x[c];
                    a1 += w1[c] * x[c];
                    a2 += w2[c] * x[c];
                    a3 += w3[c] * x[c];
                }
                float *y = Y + t * ldy + r;
                y[0] = a0, y[1] = a1, y[2] = a2, y[3] = a3;
            }
        }
        for (; r < r1; r++)
            for (int64_t t = 0; t < n; t++) Y[t * ldy + r] = dot(m->w + r * m->s_row, X + t * ldx, m->cols);
    } else { /* input-major: accumulate column by column over this thread's contiguous rows */
        const int64_t width = r1 - r0;
        for (int64_t t = 0; t < n; t++) memset(Y + t * ldy + r0, 0, (size_t)width * sizeof(float));
        int64_t c = 0;
        for (; c + 4 <= m->cols; c += 4) {
            const float *w0 = m->w + c * m->s_col + r0, *w1 = w0 + m->s_col, *w2 = w1 + m->s_col, *w3 = w2 + m->s_col;
            for (int64_t t = 0; t < n; t++) {
                const float *x = X + t * ldx;
                const float x0 = x[c], x1 = x[c + 1], x2 = x[c + 2], x3 = x[c + 3];
                float *out = Y + t * ldy + r0;
#pragma omp simd
                for (int64_t i = 0; i < width; i++) out[i] += x0 * w0[i] + x1 * w1[i] + x2 * w2[i] + x3 * w3[i];
            }
        }
        for (; c < m->cols; c++) {
            const float *w0 = m->w + c * m->s_col + r0;
            for (int64_t t = 0; t < n; t++) {
                const float x0 = X[t * ldx + c];
                float *out = Y + t * ldy + r0;
#pragma omp simd
                for (int64_t i = 0; i < width; i++) out[i] += x0 * w0[i];
            }
        }
    }
    if (bias)
        for (int64_t t = 0; t < n; t++)
            for (int64_t r = r0; r < r1; r++) Y[t * ldy + r] += bias[r];
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

/* Y = X W^T (+ bias) for n rows, this thread's share of W's rows (no barrier). */
static void gemm(const Mat *m, const float *X, int64_t ldx, float *Y, int64_t ldy, int64_t n, const float *bias) {
    int64_t r0, r1;
    share(m->rows, &r0, &r1);
    if (r0 < r1) gemm_rows(m, X, ldx, Y, ldy, n, bias, r0, r1);
}

static Mat expert(const Mat *m, int64_t index, int64_t stride) {
    Mat e = *m;
    if (e.quant) return e; /* packed matrices are dense MLPs' only (expert 0) */
    e.w += index * stride;
    if (e.half) e.half += index * stride;
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

/* scores[j] = q . keys[j] * scale for j < count, keys [count, dim] in rows. */
static void scores_of(const float *q, const float *keys, int64_t count, int64_t dim, float scale, float *scores) {
#if defined(__AVX2__) && defined(__FMA__)
    if (dim % 8 == 0) { /* a head wider than attend_rows_exact takes (256) still scores 8 keys at a time */
        scores_exact(q, keys, count, dim, scale, scores);
        return;
    }
#endif
    for (int64_t j = 0; j < count; j++) scores[j] = dot(q, keys + j * dim, dim) * scale;
}

/* One query head over the cache's committed rows [0, length) and the visible ones of the n new
 * rows after them (visible[j], or all of them when visible is NULL). */
static void attend_head(const float *q, const float *keys, const float *values, int64_t length, int64_t n,
                        const uint8_t *visible, int64_t dim, float scale, float *scores, float *out) {
    const int64_t count = length + n;
    float peak = -INFINITY, total = 0.0f;
    scores_of(q, keys, count, dim, scale, scores);
    for (int64_t j = length; j < count; j++)
        if (visible && !visible[j - length]) scores[j] = -INFINITY;
#pragma omp simd reduction(max : peak)
    for (int64_t j = 0; j < count; j++) peak = scores[j] > peak ? scores[j] : peak;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < count; j++) total += scores[j] = expf(scores[j] - peak);
    memset(out, 0, (size_t)dim * sizeof(float));
    for (int64_t j = 0; j < count; j++) {
        const float p = scores[j] / total;
        if (p == 0.0f) continue;
        const float *v = values + j * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; d++) out[d] += p * v[d];
    }
}

/* Query rows sharing one kv head of one sequence (a pass's rows: the group's heads of a few
 * consecutive tokens), each over its own count of keys. */
static void attend_rows(AttendRow *rows, int R, const float *keys, const float *values, int64_t length, int64_t dim,
                        float scale) {
#if defined(__AVX2__) && defined(__FMA__)
    /* a pass of several tokens (its probe ran AVX-512 here); a decode step's few rows measured no faster */
    if (qkernel == QKERNEL_AVX512_VNNI && R >= TRANSPOSE_ROWS && dim % 16 == 0 && dim <= 128) {
        attend_rows_avx512(rows, R, keys, values, length, dim, scale);
        return;
    }
    if (dim % 8 == 0 && dim <= 128) {
        attend_rows_exact(rows, R, keys, values, length, dim, scale);
        return;
    }
#endif
    for (int r = 0; r < R; r++)
        attend_head(rows[r].q, keys, values, length, rows[r].count - length, rows[r].visible, dim, scale,
                    rows[r].scores, rows[r].out);
}

int64_t specdec_abi_version(void) { return 10; }

/* Whether products read a matrix's bf16 copy (the vector build), so the binding makes one. */
int64_t specdec_reads_bf16(void) {
#if defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

/* Runs the build's own vector code on a few numbers and checks them: 0 where this CPU executes
 * it. The binding calls it in a forked child before it uses a build made for wider vectors than
 * the baseline (an instruction the CPU refuses kills the child, not the server). */
int specdec_build_probe(void) {
#if defined(__AVX2__) && defined(__FMA__)
    float x[8], out[8];
    for (int i = 0; i < 8; i++) x[i] = -4.0f + (float)i;
    _mm256_storeu_ps(out, exp8(_mm256_loadu_ps(x)));
    for (int i = 0; i < 8; i++)
        if (fabsf(out[i] - expf(x[i])) > 1e-3f * expf(x[i])) return 1;
#endif
    float a[64], b[64], expected = 0.0f;
    for (int i = 0; i < 64; i++) a[i] = 0.25f * (float)i, b[i] = 1.0f - 0.01f * (float)i, expected += a[i] * b[i];
    return fabsf(dot(a, b, 64) - expected) <= 1e-3f * fabsf(expected) ? 0 : 1;
}

#include "cpu_decode_experts.h" /* routing and the experts' products */

/* n new tokens of nseq sequences (seqs; their tokens contiguous, in order) at `positions`.
 * rows [nrows]: the tokens whose logits are wanted (NULL: all, nrows = n); logits [nrows, V].
 * ids_out [layers with experts, n, k]; capture_out [n, captured layers * H] or NULL; threads:
 * the caller's (torch's) thread count, the calling thread's own setting.
 * Returns 0, or -1 when scratch memory is lacking. */
int specdec_forward(const Model *m, int64_t nseq, const Seq *seqs, int64_t n, const int64_t *tokens,
                    const int64_t *positions, const int64_t *rows, int64_t nrows, float *logits, int64_t *ids_out,
                    float *capture_out, int threads) {
    const int64_t H = m->hidden, D = m->head_dim, Hq = m->heads, Hkv = m->kv_heads;
    const int64_t I = m->intermediate; /* the widest layer's */
    const int64_t group = Hq / Hkv, width = (Hq + 2 * Hkv) * D;
    const int64_t k_max = m->top_k > 0 ? m->top_k : 1, pairs = n * k_max;
    int64_t count = 0, masks = 0; /* the longest row of attention scores (rounded up to KEY_CHUNK); causal mask bytes */
    for (int64_t s = 0; s < nseq; s++) {
        if (seqs[s].length + seqs[s].n > count) count = (seqs[s].length + seqs[s].n + KEY_CHUNK - 1) / KEY_CHUNK * KEY_CHUNK;
        if (!seqs[s].mask) masks += seqs[s].n * seqs[s].n;
    }
    /* a pass of attention: the group's heads of `span` consecutive tokens of one sequence */
    const int64_t fit = PASS_SCORES / (count > 0 ? count : 1) / group;
    const int64_t span = fit < 1 ? 1 : fit > PASS_TOKENS ? PASS_TOKENS : fit, pass_rows = span * group;
    const size_t floats = (size_t)(n * (3 * H + width + Hq * D + 2 * D + 256) + pairs * (2 * I + 2 * H) +
                                   (int64_t)threads * pass_rows * count);
    float *scratch = malloc(floats * sizeof(float));
    int64_t *indices = malloc((size_t)(3 * pairs + 3 * n + 1) * sizeof(int64_t));
    float *weights = malloc((size_t)pairs * sizeof(float));
    uint8_t *causal = malloc((size_t)(masks + 1));
    const uint8_t **mask_of = malloc((size_t)(nseq + 1) * sizeof(uint8_t *));
    /* each thread's quantized activations (packed matrices): n rows of the widest input */
    const int64_t widest = (I > H ? I : H) > Hq * D ? (I > H ? I : H) : Hq * D;
    const size_t qact_stride = (qact_bytes(n, widest) + 63) / 64 * 64;
    char *qacts = malloc(qact_stride * (size_t)threads + 64);
    if (!scratch || !indices || !weights || !causal || !mask_of || !qacts) {
        free(scratch), free(indices), free(weights), free(causal), free(mask_of), free(qacts);
        return -1;
    }
    int64_t *seq_of = indices + 3 * pairs, *local_of = seq_of + n; /* each token's sequence and index in it */
    int64_t *pass_start = local_of + n, passes = 0; /* the first token of each attention pass, then n */
    uint8_t *next_mask = causal;
    for (int64_t s = 0, t = 0; s < nseq; s++) {
        const int64_t ns = seqs[s].n;
        for (int64_t j = 0; j < ns; j++, t++) {
            seq_of[t] = s, local_of[t] = j;
            if (j % span == 0) pass_start[passes++] = t;
        }
        if (seqs[s].mask) {
            mask_of[s] = seqs[s].mask;
            continue;
        }
        for (int64_t a = 0; a < ns; a++)
            for (int64_t b = 0; b < ns; b++) next_mask[a * ns + b] = b <= a;
        mask_of[s] = next_mask, next_mask += ns * ns;
    }
    float *x = scratch, *normed = x + n * H, *h = normed + n * H, *qkv = h + n * H, *att = qkv + n * width;
    float *cos_ = att + n * Hq * D, *sin_ = cos_ + n * D, *router_logits = sin_ + n * D;
    float *act = router_logits + n * 256, *expert_out = act + pairs * 2 * I, *gathered = expert_out + pairs * H;
    float *scores = gathered + pairs * H; /* [threads][pass_rows][count] */
    pass_start[passes] = n;
    int64_t *ids = indices, *order = indices + pairs, *position_of = order + pairs;
    const int64_t captures = capture_out ? m->capture_count : 0;

    for (int64_t t = 0; t < n; t++) {
        if (m->embed_quant)
            qmat_row(m->embed_quant, tokens[t], x + t * H);
        else
            memcpy(x + t * H, m->embed + tokens[t] * H, (size_t)H * sizeof(float));
        for (int64_t i = 0; i < D / 2; i++) {
            const float angle = (float)positions[t] * m->inv_freq[i];
            cos_[t * D + i] = cos_[t * D + i + D / 2] = cosf(angle) * m->rope_factor;
            sin_[t * D + i] = sin_[t * D + i + D / 2] = sinf(angle) * m->rope_factor;
        }
    }
    int64_t moe_layer = 0;
#pragma omp parallel num_threads(threads)
    {
    thread_qact = qact_at(qacts + qact_stride * (size_t)omp_get_thread_num(), n, widest);
    for (int64_t l = 0; l < m->num_layers; l++) {
        const Layer *layer = m->layers + l;
        const int64_t slots = layer->num_experts ? m->top_k : 1;
#pragma omp single
        for (int64_t t = 0; t < n; t++) {
            for (int64_t slot = 0; slot < captures; slot++)
                if (m->capture[slot] == l) memcpy(capture_out + (t * captures + slot) * H, x + t * H, (size_t)H * sizeof(float));
            rms_norm(x + t * H, layer->attn_norm, normed + t * H, H, m->eps);
        }
        gemm(&layer->qkv, normed, H, qkv, width, n, layer->qkv_bias);
#pragma omp barrier
#pragma omp single
        {
            for (int64_t t = 0; t < n; t++) {
                for (int64_t head = 0; head < Hq + Hkv; head++) {
                    float *vec = qkv + t * width + head * D;
                    if (layer->qk_norm) rms_norm(vec, layer->qk_norm + head * D, vec, D, m->eps);
                    rope(vec, cos_ + t * D, sin_ + t * D, D);
                }
                const Seq *seq = seqs + seq_of[t];
                const int64_t layer_rows = l * Hkv * seq->capacity * D;
                for (int64_t kv = 0; kv < Hkv; kv++) {
                    const int64_t row = layer_rows + (kv * seq->capacity + seq->length + local_of[t]) * D;
                    memcpy(seq->keys + row, qkv + t * width + (Hq + kv) * D, (size_t)D * sizeof(float));
                    memcpy(seq->values + row, qkv + t * width + (Hq + Hkv + kv) * D, (size_t)D * sizeof(float));
                }
            }
        }
        /* kv head by kv head: each thread takes whole heads across all the tokens, which keeps the
         * threads even when a causal chunk's later rows attend over more keys; a pass splits its
         * rows into parts when there are fewer passes than threads (a decode step of a model
         * with one kv head) */
        const int64_t jobs = Hkv * passes, wanted = (omp_get_num_threads() + jobs - 1) / jobs;
        const int64_t parts = wanted < group ? wanted : group;
#pragma omp for schedule(static)
        for (int64_t job = 0; job < jobs * parts; job++) {
            const int64_t kv = job / (passes * parts), pass = job / parts % passes, part = job % parts;
            const int64_t first = pass_start[pass], end = pass_start[pass + 1];
            const Seq *seq = seqs + seq_of[first];
            float *row_scores = scores + (int64_t)omp_get_thread_num() * pass_rows * count;
            AttendRow rows[pass_rows];
            int R = 0;
            for (int64_t t = first; t < end; t++) {
                /* a causal token sees no new row after its own: those would only add exact zeros */
                const int64_t seen = seq->mask ? seq->n : local_of[t] + 1;
                for (int64_t head = kv * group + part; head < (kv + 1) * group; head += parts, R++)
                    rows[R] = (AttendRow){qkv + t * width + head * D, mask_of[seq_of[t]] + local_of[t] * seq->n,
                                          seq->length + seen, row_scores + R * count, att + (t * Hq + head) * D, 0.0f};
            }
            const int64_t at = (l * Hkv + kv) * seq->capacity * D;
            attend_rows(rows, R, seq->keys + at, seq->values + at, seq->length, D, m->attn_scale);
        }
        gemm(&layer->o, att, Hq * D, h, H, n, layer->o_bias);
#pragma omp barrier
#pragma omp single
        {
            for (int64_t i = 0; i < n * H; i++) x[i] += h[i];
            for (int64_t t = 0; t < n; t++) rms_norm(x + t * H, layer->post_norm, normed + t * H, H, m->eps);
            route_tokens(m, layer, normed, n, router_logits, ids, weights, order);
            if (layer->num_experts)
                memcpy(ids_out + n * m->top_k * moe_layer++, ids, (size_t)(n * m->top_k) * sizeof(int64_t));
        }
        const int by_expert = n > 1;
        if (by_expert) {
#pragma omp for schedule(static)
            for (int64_t i = 0; i < n * slots; i++) memcpy(gathered + i * H, normed + (order[i] / slots) * H, (size_t)H * sizeof(float));
            experts_by_expert(m, layer, n, slots, ids, order, gathered, act, expert_out);
        } else if (slots >= omp_get_num_threads()) {
            experts_by_pair(m, layer, normed, n, slots, ids, order, act, expert_out);
        } else {
            experts_by_rows(m, layer, normed, slots, ids, act, expert_out);
        }
#pragma omp barrier
#pragma omp single
        {
            if (by_expert) /* where each pair's output landed */
                for (int64_t i = 0; i < n * slots; i++) position_of[order[i]] = i;
            else
                for (int64_t i = 0; i < n * slots; i++) position_of[i] = i;
            for (int64_t t = 0; t < n; t++)
                for (int64_t i = 0; i < H; i++) {
                    const int64_t first = t * slots;
                    float sum = expert_out[H * position_of[first] + i] * weights[first];
                    for (int64_t s = 1; s < slots; s++) sum += expert_out[H * position_of[first + s] + i] * weights[first + s];
                    x[t * H + i] += sum;
                }
        }
    }
#pragma omp single
    for (int64_t t = 0; t < n; t++) /* slot num_layers: the last layer's output, before the final norm */
        for (int64_t slot = 0; slot < captures; slot++)
            if (m->capture[slot] == m->num_layers) memcpy(capture_out + (t * captures + slot) * H, x + t * H, (size_t)H * sizeof(float));
#pragma omp single
    for (int64_t r = 0; r < nrows; r++) { /* the wanted rows, normed, packed at the front of h */
        const int64_t t = rows ? rows[r] : r;
        rms_norm(x + t * H, m->final_norm, h + r * H, H, m->eps);
    }
    gemm(&m->lm_head, h, H, logits, m->vocab, nrows, NULL);
    }
    free(scratch), free(indices), free(weights), free(causal), free(mask_of), free(qacts);
    return 0;
}

#include "cpu_prefill_attention.h" /* a long causal run's attention, for the eager prefill */
