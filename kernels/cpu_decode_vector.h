/* The AVX2 + FMA kernels of cpu_decode.c (included there, after Mat): the matrix products in
 * register tiles, reading fp32 weights or their exact bf16 copies, and attention in passes of rows over one kv head. Every
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

/* Sixteen outputs (w's columns, s_col apart by input) for all n tokens, six at a time; Y's
 * first output column is where w's first lies. */
static inline __attribute__((always_inline)) void tiles_input_major(const void *w, int64_t s_col, int64_t cols,
                                                                    const float *X, int64_t ldx, float *Y,
                                                                    int64_t ldy, int64_t n, const int half) {
    int64_t t = 0;
    for (; t + 6 <= n; t += 6) tile_input_major(w, s_col, cols, X + t * ldx, ldx, Y + t * ldy, ldy, 6, half);
    X += t * ldx, Y += t * ldy;
    switch (n - t) {
    case 5: tile_input_major(w, s_col, cols, X, ldx, Y, ldy, 5, half); break;
    case 4: tile_input_major(w, s_col, cols, X, ldx, Y, ldy, 4, half); break;
    case 3: tile_input_major(w, s_col, cols, X, ldx, Y, ldy, 3, half); break;
    case 2: tile_input_major(w, s_col, cols, X, ldx, Y, ldy, 2, half); break;
    case 1: tile_input_major(w, s_col, cols, X, ldx, Y, ldy, 1, half); break;
    }
}

/* Sixteen rows from `r` for all n tokens. */
static inline __attribute__((always_inline)) void panel_input_major(const Mat *m, int64_t r, const float *X,
                                                                    int64_t ldx, float *Y, int64_t ldy, int64_t n,
                                                                    const int half) {
    const void *w = half ? (const void *)(m->half + r) : (const void *)(m->w + r);
    tiles_input_major(w, m->s_col, m->cols, X, ldx, Y + r, ldy, n, half);
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
/* exp of eight softmax exponents (x <= 0), inline: every score of every row goes through this one
 * function, so a key's weight does not depend on its place in the row, and -inf (a masked key)
 * gives exactly 0. Cody-Waite reduction to r in [-ln2/2, ln2/2] and Cephes' degree-6
 * polynomial, about 1 ulp; x below -87.3 (where 2^n would leave the normal range) gives 0. */
static inline __m256 exp8(__m256 x) {
    const __m256 floor = _mm256_set1_ps(-87.3f);
    const __m256 kept = _mm256_cmp_ps(x, floor, _CMP_GE_OQ); /* false for -inf and NaN */
    x = _mm256_max_ps(x, floor);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(scale)), kept);
}

/* Eight keys' scores for one query, their sums reduced together: keys [8, dim] in rows. */
static inline __attribute__((always_inline)) void score_block(const float *q, const float *keys, int64_t dim,
                                                              __m256 factor, float *scores) {
    __m256 acc[8];
    for (int l = 0; l < 8; l++) acc[l] = _mm256_setzero_ps();
    for (int64_t d = 0; d < dim; d += 8) {
        const __m256 qd = _mm256_loadu_ps(q + d);
        for (int l = 0; l < 8; l++) acc[l] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(keys + l * dim + d), acc[l]);
    }
    /* hadd pairs lanes: each key's sum is ((0+1)+(2+3)) + ((4+5)+(6+7)) */
    const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
    const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
    const __m256 sums = _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
    _mm256_storeu_ps(scores, _mm256_mul_ps(sums, factor));
}

/* One key's score in the very order of operations score_block gives it. */
static inline float score_one(const float *q, const float *key, int64_t dim, float scale) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t d = 0; d < dim; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(key + d), acc);
    float l[8];
    _mm256_storeu_ps(l, acc);
    return (((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))) * scale;
}

/* scores[j] = q . keys[j] * scale for j < count (dim % 8 == 0): the row's body eight keys at a
 * time, its last keys one by one in the same order, so a key's score does not depend on where
 * the row ends. */
static void scores_exact(const float *q, const float *keys, int64_t count, int64_t dim, float scale, float *scores) {
    const __m256 factor = _mm256_set1_ps(scale);
    int64_t j = 0;
    for (; j + 8 <= count; j += 8) score_block(q, keys + j * dim, dim, factor, scores + j);
    for (; j < count; j++) scores[j] = score_one(q, keys + j * dim, dim, scale);
}

/* A row's scores into exp(score - peak), masked and padded keys exactly 0. */
static void softmax_numerators(AttendRow *row, int64_t length) {
    float *scores = row->scores;
    const int64_t count = row->count, padded = (count + 7) & ~(int64_t)7;
    for (int64_t j = length; j < count; j++)
        if (row->visible && !row->visible[j - length]) scores[j] = -INFINITY;
    for (int64_t j = count; j < padded; j++) scores[j] = -INFINITY;
    __m256 peaks = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < padded; j += 8) peaks = _mm256_max_ps(peaks, _mm256_loadu_ps(scores + j));
    float lanes[8], peak = -INFINITY; /* a maximum is exact in any order */
    _mm256_storeu_ps(lanes, peaks);
    for (int l = 0; l < 8; l++) peak = lanes[l] > peak ? lanes[l] : peak;
    const __m256 shift = _mm256_set1_ps(peak);
    for (int64_t j = 0; j < padded; j += 8) _mm256_storeu_ps(scores + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), shift)));
}

/* Keys [from, to) into B rows' running sums of p[j] values[j] (acc [B][V] vectors, total [B]),
 * key by key in order for each row. The rows' chains are independent, so B of them hide each
 * other's FMA latency, and each value row is read while it is hot for all of them. */
static inline __attribute__((always_inline)) void weigh_span(float *const *p, const float *values, int64_t from,
                                                             int64_t to, __m256 *acc, float *total, const int B,
                                                             const int V) {
    for (int64_t j = from; j < to; j++) {
        const float *row = values + j * 8 * V;
#pragma GCC unroll 4
        for (int b = 0; b < B; b++) {
            const __m256 pj = _mm256_broadcast_ss(p[b] + j);
            total[b] += p[b][j];
#pragma GCC unroll 16
            for (int v = 0; v < V; v++) acc[b * V + v] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(row + 8 * v), acc[b * V + v]);
        }
    }
}

/* Keys [from, to) of B rows, as far as each row goes: their common keys together, then each
 * row's last ones alone. The running sums live in each row's out and total between calls
 * (stored and loaded exactly), so a row's sums still run key by key in order. */
static inline __attribute__((always_inline)) void weigh_rows(AttendRow *rows, const float *values, int64_t from,
                                                             int64_t to, const int B, const int V) {
    __m256 acc[16];
    float total[4], *p[4];
    int64_t common = to;
#pragma GCC unroll 4
    for (int b = 0; b < B; b++) {
        total[b] = rows[b].total, p[b] = rows[b].scores;
        common = rows[b].count < common ? rows[b].count : common;
#pragma GCC unroll 16
        for (int v = 0; v < V; v++) acc[b * V + v] = _mm256_loadu_ps(rows[b].out + 8 * v);
    }
    weigh_span(p, values, from, common, acc, total, B, V);
#pragma GCC unroll 4
    for (int b = 0; b < B; b++) {
        const int64_t end = rows[b].count < to ? rows[b].count : to;
        weigh_span(p + b, values, common > from ? common : from, end, acc + b * V, total + b, 1, V);
        rows[b].total = total[b];
#pragma GCC unroll 16
        for (int v = 0; v < V; v++) _mm256_storeu_ps(rows[b].out + 8 * v, acc[b * V + v]);
    }
}

/* out = sum_j p[j] values[j] / sum_j p[j] for R rows of a head of 8 * V floats, both sums taken
 * key by key in order: a masked key's exact 0 adds nothing, and a row's output does not depend
 * on the rows beside it. The keys go in chunks that stay in L1 while every row takes them, rows
 * B at a time (as many as 12 accumulators hold), then two or one. */
#define VALUE_CHUNK 64
#define WEIGH_ALL(V, B)                                                                             \
    static void weigh_all_##V(AttendRow *rows, int R, const float *values, int64_t longest) {      \
        for (int64_t from = 0; from < longest; from += VALUE_CHUNK) {                               \
            const int64_t to = from + VALUE_CHUNK;                                                  \
            int i = 0;                                                                              \
            for (; i + (B) <= R; i += (B)) weigh_rows(rows + i, values, from, to, (B), (V));        \
            if ((B) > 2 && i + 2 <= R) weigh_rows(rows + i, values, from, to, 2, (V)), i += 2;      \
            for (; i < R; i++) weigh_rows(rows + i, values, from, to, 1, (V));                      \
        }                                                                                           \
        for (int r = 0; r < R; r++) {                                                               \
            const __m256 scale = _mm256_set1_ps(1.0f / rows[r].total);                              \
            for (int v = 0; v < (V); v++)                                                           \
                _mm256_storeu_ps(rows[r].out + 8 * v, _mm256_mul_ps(_mm256_loadu_ps(rows[r].out + 8 * v), scale)); \
        }                                                                                           \
    }
WEIGH_ALL(1, 4) WEIGH_ALL(2, 4) WEIGH_ALL(3, 4) WEIGH_ALL(4, 3) WEIGH_ALL(5, 2) WEIGH_ALL(6, 2)
WEIGH_ALL(7, 1) WEIGH_ALL(8, 1) WEIGH_ALL(9, 1) WEIGH_ALL(10, 1) WEIGH_ALL(11, 1) WEIGH_ALL(12, 1)
WEIGH_ALL(13, 1) WEIGH_ALL(14, 1) WEIGH_ALL(15, 1) WEIGH_ALL(16, 1)
#undef WEIGH_ALL

/* Keys for the scores of a long pass: a chunk of KEY_CHUNK keys transposed once, so that every
 * row then scores eight keys with eight lanes. The sums keep score_block's order exactly (per
 * key, eight partial sums over the dimensions d = i mod 8, then ((0+1)+(2+3))+((4+5)+(6+7))), so
 * a row scored here and a row scored by scores_exact get the very same numbers. */
#define TRANSPOSE_ROWS 8 /* rows in a pass from which the keys are transposed */

/* The chunk's keys transposed `lanes` (8 or 16) at a time, zeros past `valid`: with 8,
 * kt[(b * dim + d) * 8 + l] = keys[(8 b + l) * dim + d]; with 16, each dimension's row holds
 * sixteen keys, kt[(k / 16 * dim + d) * 16 + k % 16] = keys[k * dim + d]. */
static void transpose_chunk(const float *keys, int64_t valid, int64_t dim, float *kt, const int lanes) {
    for (int64_t b = 0; b < KEY_CHUNK / 8; b++)
        for (int64_t d = 0; d < dim; d += 8) {
            __m256 r[8];
            for (int64_t l = 0; l < 8; l++)
                r[l] = 8 * b + l < valid ? _mm256_loadu_ps(keys + (8 * b + l) * dim + d) : _mm256_setzero_ps();
            const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
            const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
            const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
            const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
            const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            const int per_row = lanes / 8; /* blocks of eight keys side by side in a row */
            float *out = kt + (b / per_row * dim + d) * lanes + b % per_row * 8;
            _mm256_storeu_ps(out + 0 * lanes, _mm256_permute2f128_ps(s0, s4, 0x20));
            _mm256_storeu_ps(out + 1 * lanes, _mm256_permute2f128_ps(s1, s5, 0x20));
            _mm256_storeu_ps(out + 2 * lanes, _mm256_permute2f128_ps(s2, s6, 0x20));
            _mm256_storeu_ps(out + 3 * lanes, _mm256_permute2f128_ps(s3, s7, 0x20));
            _mm256_storeu_ps(out + 4 * lanes, _mm256_permute2f128_ps(s0, s4, 0x31));
            _mm256_storeu_ps(out + 5 * lanes, _mm256_permute2f128_ps(s1, s5, 0x31));
            _mm256_storeu_ps(out + 6 * lanes, _mm256_permute2f128_ps(s2, s6, 0x31));
            _mm256_storeu_ps(out + 7 * lanes, _mm256_permute2f128_ps(s3, s7, 0x31));
        }
}

/* Partial sums i of NB blocks of eight keys: sum over d = i, i + 8, ... of q[d] kt[d], in order
 * (the first product alone, as an FMA onto zero rounds it). */
static inline __attribute__((always_inline)) void partial_sums(const float *q, const float *const *blocks, int64_t dim,
                                                               int i, __m256 *out, const int NB) {
    const __m256 first = _mm256_broadcast_ss(q + i);
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) out[b] = _mm256_mul_ps(first, _mm256_loadu_ps(blocks[b] + i * 8));
    for (int64_t d = i + 8; d < dim; d += 8) {
        const __m256 qd = _mm256_broadcast_ss(q + d);
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) out[b] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(blocks[b] + d * 8), out[b]);
    }
}

/* The chunk's scores (from `at`) of one row, NB blocks of eight keys side by side: the low
 * half of the tree, (0+1)+(2+3), parked in the row's scores while the high half is summed. */
static inline __attribute__((always_inline)) void score_row(const AttendRow *row, int64_t at, const float *kt,
                                                            int64_t dim, __m256 factor, const int NB) {
    for (int64_t b0 = 0; b0 < KEY_CHUNK / 8; b0 += NB) {
        const float *blocks[4];
        __m256 a[4], t[4], u[4];
        float *out = row->scores + at + b0 * 8;
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) blocks[b] = kt + (b0 + b) * dim * 8;
        for (int half = 0; half < 2; half++) {
            partial_sums(row->q, blocks, dim, 4 * half, a, NB);
            partial_sums(row->q, blocks, dim, 4 * half + 1, t, NB);
#pragma GCC unroll 4
            for (int b = 0; b < NB; b++) a[b] = _mm256_add_ps(a[b], t[b]);
            partial_sums(row->q, blocks, dim, 4 * half + 2, t, NB);
            partial_sums(row->q, blocks, dim, 4 * half + 3, u, NB);
#pragma GCC unroll 4
            for (int b = 0; b < NB; b++) {
                a[b] = _mm256_add_ps(a[b], _mm256_add_ps(t[b], u[b]));
                if (half == 0)
                    _mm256_storeu_ps(out + b * 8, a[b]);
                else
                    _mm256_storeu_ps(out + b * 8, _mm256_mul_ps(_mm256_add_ps(_mm256_loadu_ps(out + b * 8), a[b]), factor));
            }
        }
    }
}

/* The rows' running sums emptied, and the most keys any of them attends over. */
static int64_t begin_rows(AttendRow *rows, int R, int64_t dim) {
    int64_t longest = 0;
    for (int r = 0; r < R; r++) {
        longest = rows[r].count > longest ? rows[r].count : longest;
        rows[r].total = 0.0f;
        memset(rows[r].out, 0, (size_t)dim * sizeof(float));
    }
    return longest;
}

/* R query rows over one kv head's keys and values (heads of 8 to 128, a multiple of 8), with
 * the same numbers for each row however many others share its pass or its step. Keys stream
 * once a pass, chunk by chunk, each chunk transposed once for all the rows; row scores have
 * room for count rounded up to KEY_CHUNK. */
static void attend_rows_exact(AttendRow *rows, int R, const float *keys, const float *values, int64_t length,
                              int64_t dim, float scale) {
    const __m256 factor = _mm256_set1_ps(scale);
    const int64_t longest = begin_rows(rows, R, dim);
    if (R < TRANSPOSE_ROWS) { /* too few rows to pay for transposing the keys */
        for (int r = 0; r < R; r++) scores_exact(rows[r].q, keys, rows[r].count, dim, scale, rows[r].scores);
    } else {
        float kt[KEY_CHUNK * 128] __attribute__((aligned(32)));
        for (int64_t at = 0; at < longest; at += KEY_CHUNK) {
            transpose_chunk(keys + at * dim, longest - at < KEY_CHUNK ? longest - at : KEY_CHUNK, dim, kt, 8);
            for (int r = 0; r < R; r++)
                if (rows[r].count > at) score_row(rows + r, at, kt, dim, factor, 4);
        }
    }
    for (int r = 0; r < R; r++) softmax_numerators(rows + r, length);
    switch (dim / 8) { /* the head's width a compile-time constant, so its sums stay in registers */
#define WEIGH(V) case V: weigh_all_##V(rows, R, values, longest); return;
    WEIGH(1) WEIGH(2) WEIGH(3) WEIGH(4) WEIGH(5) WEIGH(6) WEIGH(7) WEIGH(8)
    WEIGH(9) WEIGH(10) WEIGH(11) WEIGH(12) WEIGH(13) WEIGH(14) WEIGH(15) WEIGH(16)
#undef WEIGH
    }
}
#endif
