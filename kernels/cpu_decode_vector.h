/* The AVX2 + FMA kernels of cpu_decode.c (included there, after Mat): the matrix products in
 * register tiles, reading fp32 weights or their exact bf16 copies, and one attention head. Every
 * sum runs in an order fixed per token, so a token's numbers do not depend on what else shares
 * its step (see cpu_decode.c). Built without AVX2 and FMA, cpu_decode.c keeps its portable loops.
 */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* The vector products. Each output y[t][r] is summed in one fixed order whatever the number of
 * tokens, the tile it falls in or the thread that computes it, so that a token's logits do not
 * depend on what else shares its step: a verify pass sees the numbers that decoding the same
 * tokens one by one would. A matrix with a bf16 copy (Mat.half) is read from it: the same
 * values in half the bytes, which is what a memory-bound step pays for. */

static inline __attribute__((always_inline)) __m256 load_weights(const void *w, int64_t at, const int half) {
    if (half) /* bf16 to fp32 is exact: the bf16 bits are the float's upper half */
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + at))), 16));
    return _mm256_loadu_ps((const float *)w + at);
}

/* Input-major (s_row == 1): y[t][r..r+16) = sum over c, in order, of x[t][c] w[c][r..r+16), for
 * T tokens at once (2T accumulators in registers, each weight vector loaded once for all T). */
static inline __attribute__((always_inline)) void tile_input_major(const void *w, int64_t s_col, int64_t cols,
                                                                   const float *X, int64_t ldx, float *Y,
                                                                   int64_t ldy, const int T, const int half) {
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int64_t c = 0; c < cols; c++) {
        const __m256 w0 = load_weights(w, c * s_col, half), w1 = load_weights(w, c * s_col + 8, half);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            const __m256 xb = _mm256_broadcast_ss(X + t * ldx + c);
            acc[t][0] = _mm256_fmadd_ps(xb, w0, acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(xb, w1, acc[t][1]);
        }
    }
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) {
        _mm256_storeu_ps(Y + t * ldy, acc[t][0]);
        _mm256_storeu_ps(Y + t * ldy + 8, acc[t][1]);
    }
}

/* Sixteen rows from `r` for all n tokens, six at a time. */
static inline __attribute__((always_inline)) void panel_input_major(const Mat *m, int64_t r, const float *X,
                                                                    int64_t ldx, float *Y, int64_t ldy, int64_t n,
                                                                    const int half) {
    const void *w = half ? (const void *)(m->half + r) : (const void *)(m->w + r);
    int64_t t = 0;
    for (; t + 6 <= n; t += 6) tile_input_major(w, m->s_col, m->cols, X + t * ldx, ldx, Y + t * ldy + r, ldy, 6, half);
    X += t * ldx, Y += t * ldy + r;
    switch (n - t) {
    case 5: tile_input_major(w, m->s_col, m->cols, X, ldx, Y, ldy, 5, half); break;
    case 4: tile_input_major(w, m->s_col, m->cols, X, ldx, Y, ldy, 4, half); break;
    case 3: tile_input_major(w, m->s_col, m->cols, X, ldx, Y, ldy, 3, half); break;
    case 2: tile_input_major(w, m->s_col, m->cols, X, ldx, Y, ldy, 2, half); break;
    case 1: tile_input_major(w, m->s_col, m->cols, X, ldx, Y, ldy, 1, half); break;
    }
}

static void gemm_input_major(const Mat *m, const float *X, int64_t ldx, float *Y, int64_t ldy, int64_t n,
                             int64_t r0, int64_t r1) {
    int64_t r = r0;
    for (; r + 16 <= r1; r += 16) {
        if (m->half)
            panel_input_major(m, r, X, ldx, Y, ldy, n, 1);
        else
            panel_input_major(m, r, X, ldx, Y, ldy, n, 0);
    }
    for (; r < r1; r++) /* the last few rows: one lane's order, in scalar */
        for (int64_t t = 0; t < n; t++) {
            float acc = 0.0f;
            for (int64_t c = 0; c < m->cols; c++) acc = fmaf(X[t * ldx + c], m->w[c * m->s_col + r], acc);
            Y[t * ldy + r] = acc;
        }
}

/* The sum of a vector's lanes, always in the order ((0+4)+(2+6)) + ((1+5)+(3+7)). */
static inline float lanes_sum(__m256 v) {
    __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    half = _mm_add_ps(half, _mm_movehl_ps(half, half));
    return _mm_cvtss_f32(_mm_add_ss(half, _mm_shuffle_ps(half, half, 1)));
}

/* Output-major (s_col == 1, cols % 8 == 0): y[t][r] = lanes_sum of eight running sums (lane j
 * takes the columns c = j mod 8, in order), for R rows and T tokens at once. */
static inline __attribute__((always_inline)) void tile_output_major(const void *w, int64_t s_row, int64_t cols,
                                                                    const float *X, int64_t ldx, float *Y,
                                                                    int64_t ldy, const int R, const int T,
                                                                    const int half) {
    __m256 acc[4][3];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) acc[i][t] = _mm256_setzero_ps();
    for (int64_t c = 0; c < cols; c += 8) {
        __m256 x[3];
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) x[t] = _mm256_loadu_ps(X + t * ldx + c);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            const __m256 wv = load_weights(w, i * s_row + c, half);
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) acc[i][t] = _mm256_fmadd_ps(wv, x[t], acc[i][t]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) Y[t * ldy + i] = lanes_sum(acc[i][t]);
}

static inline __attribute__((always_inline)) void rows_output_major(const Mat *m, const float *X, int64_t ldx,
                                                                    float *Y, int64_t ldy, int64_t n, int64_t r0,
                                                                    int64_t r1, const int half) {
    for (int64_t r = r0; r < r1;) {
        const int64_t at = r * m->s_row;
        const void *w = half ? (const void *)(m->half + at) : (const void *)(m->w + at);
        int64_t t = 0;
        if (r + 4 <= r1) {
            for (; t + 3 <= n; t += 3)
                tile_output_major(w, m->s_row, m->cols, X + t * ldx, ldx, Y + t * ldy + r, ldy, 4, 3, half);
            for (; t < n; t++) tile_output_major(w, m->s_row, m->cols, X + t * ldx, ldx, Y + t * ldy + r, ldy, 4, 1, half);
            r += 4;
        } else {
            for (; t < n; t++) tile_output_major(w, m->s_row, m->cols, X + t * ldx, ldx, Y + t * ldy + r, ldy, 1, 1, half);
            r += 1;
        }
    }
}

static void gemm_output_major(const Mat *m, const float *X, int64_t ldx, float *Y, int64_t ldy, int64_t n,
                              int64_t r0, int64_t r1) {
    if (m->half)
        rows_output_major(m, X, ldx, Y, ldy, n, r0, r1, 1);
    else
        rows_output_major(m, X, ldx, Y, ldy, n, r0, r1, 0);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* glibc's 8-wide AVX2 expf, called by name so that every score goes through the same exp
 * whatever its place in the row (a compiler's vectorised loop would send the row's tail through
 * another). Without libmvec, the scalar expf for every lane. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(SPECDEC_NO_MVEC)
__m256 _ZGVdN8v_expf(__m256);
static inline __m256 exp8(__m256 v) { return _ZGVdN8v_expf(v); }
#else
static inline __m256 exp8(__m256 v) {
    float lanes[8];
    _mm256_storeu_ps(lanes, v);
    for (int l = 0; l < 8; l++) lanes[l] = expf(lanes[l]);
    return _mm256_loadu_ps(lanes);
}
#endif

/* scores[j] = q . keys[j] * scale for j < count (dim % 8 == 0). Eight keys at a time, their sums
 * reduced together; the row's last keys one by one in the very same order of operations, so a
 * key's score does not depend on where the row ends. */
static void scores_exact(const float *q, const float *keys, int64_t count, int64_t dim, float scale, float *scores) {
    const __m256 factor = _mm256_set1_ps(scale);
    int64_t j = 0;
    for (; j + 8 <= count; j += 8) {
        __m256 acc[8];
        for (int l = 0; l < 8; l++) acc[l] = _mm256_setzero_ps();
        for (int64_t d = 0; d < dim; d += 8) {
            const __m256 qd = _mm256_loadu_ps(q + d);
            for (int l = 0; l < 8; l++) acc[l] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(keys + (j + l) * dim + d), acc[l]);
        }
        /* hadd pairs lanes: each key's sum is ((0+1)+(2+3)) + ((4+5)+(6+7)) */
        const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
        const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
        const __m256 sums = _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
        _mm256_storeu_ps(scores + j, _mm256_mul_ps(sums, factor));
    }
    for (; j < count; j++) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t d = 0; d < dim; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(keys + j * dim + d), acc);
        float l[8];
        _mm256_storeu_ps(l, acc);
        scores[j] = (((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))) * scale;
    }
}

/* out = sum_j p[j] values[j] / sum_j p[j] for a head of 8 * V floats, both sums taken key by key
 * in order: a masked key's p is exactly 0 and adds nothing, so a tree token's output is the one
 * decoding its path alone gives, wherever its ancestors sit among the tree's rows. */
static inline __attribute__((always_inline)) void weigh_values(const float *p, const float *values, int64_t count,
                                                               float *out, const int V) {
    __m256 acc[16];
    float total = 0.0f;
#pragma GCC unroll 16
    for (int v = 0; v < V; v++) acc[v] = _mm256_setzero_ps();
    for (int64_t j = 0; j < count; j++) {
        const __m256 pj = _mm256_broadcast_ss(p + j);
        const float *row = values + j * 8 * V;
        total += p[j];
#pragma GCC unroll 16
        for (int v = 0; v < V; v++) acc[v] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(row + 8 * v), acc[v]);
    }
    const __m256 scale = _mm256_set1_ps(1.0f / total);
#pragma GCC unroll 16
    for (int v = 0; v < V; v++) _mm256_storeu_ps(out + 8 * v, _mm256_mul_ps(acc[v], scale));
}

/* attend_head for a head of 8 to 128 (a multiple of 8) with the same numbers for a token however many
 * others share its step. scores has room for count rounded up to 8. */
static void attend_head_exact(const float *q, const float *keys, const float *values, int64_t length, int64_t n,
                              const uint8_t *visible, int64_t dim, float scale, float *scores, float *out) {
    const int64_t count = length + n, padded = (count + 7) & ~(int64_t)7;
    scores_exact(q, keys, count, dim, scale, scores);
    for (int64_t j = length; j < count; j++)
        if (visible && !visible[j - length]) scores[j] = -INFINITY;
    for (int64_t j = count; j < padded; j++) scores[j] = -INFINITY;
    __m256 peaks = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < padded; j += 8) peaks = _mm256_max_ps(peaks, _mm256_loadu_ps(scores + j));
    float lanes[8], peak = -INFINITY; /* a maximum is exact in any order */
    _mm256_storeu_ps(lanes, peaks);
    for (int l = 0; l < 8; l++) peak = lanes[l] > peak ? lanes[l] : peak;
    const __m256 shift = _mm256_set1_ps(peak);
    for (int64_t j = 0; j < padded; j += 8) _mm256_storeu_ps(scores + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), shift)));
    switch (dim / 8) { /* the head's width a compile-time constant, so its sums stay in registers */
#define WEIGH(V) case V: weigh_values(scores, values, count, out, V); return;
    WEIGH(1) WEIGH(2) WEIGH(3) WEIGH(4) WEIGH(5) WEIGH(6) WEIGH(7) WEIGH(8)
    WEIGH(9) WEIGH(10) WEIGH(11) WEIGH(12) WEIGH(13) WEIGH(14) WEIGH(15) WEIGH(16)
#undef WEIGH
    }
}
#endif
