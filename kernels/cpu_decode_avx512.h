/* Attention with AVX-512 (included by cpu_decode.c after cpu_decode_vector.h), for passes of
 * TRANSPOSE_ROWS rows or more where the packed matrices' probe chose the AVX-512 VNNI kernel, so
 * the CPU runs these instructions (attend_rows). It gives the very numbers of the AVX2 attention
 * (attend_rows_exact): every lane runs the same operations in the same order, only sixteen of
 * them side by side instead of eight. What changes is how many independent sums are in flight:
 * the AVX2 scores ran four chains of fused multiply-adds, each waiting on the one before, and
 * heads of 64 or more weighed their values one row at a time, each row loading the value vectors
 * again; here the scores run eight chains of sixteen keys and the values take rows together,
 * each value vector loaded once for all of them. */
#if defined(__AVX2__) && defined(__FMA__)
#define AVX512_ATTENTION __attribute__((target("avx512f")))
_Static_assert(KEY_CHUNK == 64, "score_row16 takes a chunk as four blocks of sixteen keys");

/* Partial sums i and i + 1 (each over d = i, i + 8, ... in order, the first product alone) of
 * the four blocks of sixteen keys of a chunk transposed sixteen to a row (transpose_chunk's
 * layout with 16 lanes): eight chains, so that each one's latency hides behind the others. */
static inline __attribute__((always_inline)) AVX512_ATTENTION void two_partial_sums16(const float *q, const float *kt,
                                                                                     int64_t dim, int i, __m512 *x,
                                                                                     __m512 *y) {
    __m512 qi = _mm512_set1_ps(q[i]), qj = _mm512_set1_ps(q[i + 1]);
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        x[g] = _mm512_mul_ps(qi, _mm512_loadu_ps(kt + (g * dim + i) * 16));
        y[g] = _mm512_mul_ps(qj, _mm512_loadu_ps(kt + (g * dim + i + 1) * 16));
    }
    for (int64_t d = i + 8; d < dim; d += 8) {
        qi = _mm512_set1_ps(q[d]), qj = _mm512_set1_ps(q[d + 1]);
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            x[g] = _mm512_fmadd_ps(qi, _mm512_loadu_ps(kt + (g * dim + d) * 16), x[g]);
            y[g] = _mm512_fmadd_ps(qj, _mm512_loadu_ps(kt + (g * dim + d + 1) * 16), y[g]);
        }
    }
}

/* ((s_i + s_i+1) + (s_i+2 + s_i+3)) for the chunk's 64 keys. */
static inline __attribute__((always_inline)) AVX512_ATTENTION void quarter_sums16(const float *q, const float *kt,
                                                                                 int64_t dim, int i, __m512 *out) {
    __m512 x[4], y[4], u[4], w[4];
    two_partial_sums16(q, kt, dim, i, x, y);
    two_partial_sums16(q, kt, dim, i + 2, u, w);
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) out[g] = _mm512_add_ps(_mm512_add_ps(x[g], y[g]), _mm512_add_ps(u[g], w[g]));
}

/* One row's scores of the chunk at `at` (KEY_CHUNK = 64 keys): score_block's order per key,
 * ((0+1)+(2+3)) + ((4+5)+(6+7)), times the scale. */
static inline __attribute__((always_inline)) AVX512_ATTENTION void score_row16(const AttendRow *row, int64_t at,
                                                                              const float *kt, int64_t dim,
                                                                              __m512 factor) {
    __m512 low[4], high[4];
    quarter_sums16(row->q, kt, dim, 0, low);
    quarter_sums16(row->q, kt, dim, 4, high);
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++)
        _mm512_storeu_ps(row->scores + at + 16 * g, _mm512_mul_ps(_mm512_add_ps(low[g], high[g]), factor));
}

/* weigh_span with sixteen lanes: keys [from, to) into B rows' running sums, key by key. */
static inline __attribute__((always_inline)) AVX512_ATTENTION void weigh_span16(float *const *p, const float *values,
                                                                               int64_t from, int64_t to, __m512 *acc,
                                                                               float *total, const int B, const int V) {
    for (int64_t j = from; j < to; j++) {
        const float *row = values + j * 16 * V;
#pragma GCC unroll 4
        for (int b = 0; b < B; b++) {
            const __m512 pj = _mm512_set1_ps(p[b][j]);
            total[b] += p[b][j];
#pragma GCC unroll 8
            for (int v = 0; v < V; v++) acc[b * V + v] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(row + 16 * v), acc[b * V + v]);
        }
    }
}

/* weigh_rows with sixteen lanes: the rows' common keys together, then each row's last ones. */
static inline __attribute__((always_inline)) AVX512_ATTENTION void weigh_rows16(AttendRow *rows, const float *values,
                                                                               int64_t from, int64_t to, const int B,
                                                                               const int V) {
    __m512 acc[16];
    float total[4], *p[4];
    int64_t common = to;
#pragma GCC unroll 4
    for (int b = 0; b < B; b++) {
        total[b] = rows[b].total, p[b] = rows[b].scores;
        common = rows[b].count < common ? rows[b].count : common;
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) acc[b * V + v] = _mm512_loadu_ps(rows[b].out + 16 * v);
    }
    weigh_span16(p, values, from, common, acc, total, B, V);
#pragma GCC unroll 4
    for (int b = 0; b < B; b++) {
        const int64_t end = rows[b].count < to ? rows[b].count : to;
        weigh_span16(p + b, values, common > from ? common : from, end, acc + b * V, total + b, 1, V);
        rows[b].total = total[b];
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) _mm512_storeu_ps(rows[b].out + 16 * v, acc[b * V + v]);
    }
}

/* weigh_all with sixteen lanes, rows B at a time (B * V accumulators of 32 registers), then
 * two or one; the division by the total as there. */
#define WEIGH_ALL16(V, B)                                                                             \
    static AVX512_ATTENTION void weigh_all16_##V(AttendRow *rows, int R, const float *values, int64_t longest) { \
        for (int64_t from = 0; from < longest; from += VALUE_CHUNK) {                                 \
            const int64_t to = from + VALUE_CHUNK;                                                    \
            int i = 0;                                                                                \
            for (; i + (B) <= R; i += (B)) weigh_rows16(rows + i, values, from, to, (B), (V));        \
            if ((B) > 2 && i + 2 <= R) weigh_rows16(rows + i, values, from, to, 2, (V)), i += 2;      \
            for (; i < R; i++) weigh_rows16(rows + i, values, from, to, 1, (V));                      \
        }                                                                                             \
        for (int r = 0; r < R; r++) {                                                                 \
            const __m512 scale = _mm512_set1_ps(1.0f / rows[r].total);                                \
            for (int v = 0; v < (V); v++)                                                             \
                _mm512_storeu_ps(rows[r].out + 16 * v, _mm512_mul_ps(_mm512_loadu_ps(rows[r].out + 16 * v), scale)); \
        }                                                                                             \
    }
WEIGH_ALL16(1, 4) WEIGH_ALL16(2, 4) WEIGH_ALL16(3, 4) WEIGH_ALL16(4, 4)
WEIGH_ALL16(5, 3) WEIGH_ALL16(6, 2) WEIGH_ALL16(7, 2) WEIGH_ALL16(8, 2)
#undef WEIGH_ALL16

/* attend_rows_exact for heads of 16 to 128 floats, a multiple of 16, with its numbers. */
static AVX512_ATTENTION void attend_rows_avx512(AttendRow *rows, int R, const float *keys, const float *values,
                                                int64_t length, int64_t dim, float scale) {
    const __m512 factor = _mm512_set1_ps(scale);
    const int64_t longest = begin_rows(rows, R, dim);
    float kt[KEY_CHUNK * 128] __attribute__((aligned(64)));
    for (int64_t at = 0; at < longest; at += KEY_CHUNK) {
        transpose_chunk(keys + at * dim, longest - at < KEY_CHUNK ? longest - at : KEY_CHUNK, dim, kt, 16);
        for (int r = 0; r < R; r++)
            if (rows[r].count > at) score_row16(rows + r, at, kt, dim, factor);
    }
    for (int r = 0; r < R; r++) softmax_numerators(rows + r, length);
    switch (dim / 16) { /* the head's width a compile-time constant, so its sums stay in registers */
#define WEIGH16(V) case V: weigh_all16_##V(rows, R, values, longest); return;
    WEIGH16(1) WEIGH16(2) WEIGH16(3) WEIGH16(4) WEIGH16(5) WEIGH16(6) WEIGH16(7) WEIGH16(8)
#undef WEIGH16
    }
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* Attention of R query rows over one kv head's keys and values [count[r] of them; length
 * committed] with the AVX2 passes (avx512 0) or these (1): the kernels alone, for the tests that
 * hold them to the same numbers. Returns -1 without memory, -2 for a head these do not take. */
int specdec_attend_rows(const float *q, int64_t R, const int64_t *count, const float *keys, const float *values,
                        int64_t length, int64_t dim, float scale, int avx512, float *out) {
    if (dim % 16 != 0 || dim > 128 || R < 1) return -2;
    int64_t longest = 0;
    for (int64_t r = 0; r < R; r++) longest = count[r] > longest ? count[r] : longest;
    const int64_t room = (longest + KEY_CHUNK - 1) / KEY_CHUNK * KEY_CHUNK;
    float *scores = malloc((size_t)(R * room) * sizeof(float));
    AttendRow *rows = malloc((size_t)R * sizeof(AttendRow));
    if (!scores || !rows) {
        free(scores), free(rows);
        return -1;
    }
    for (int64_t r = 0; r < R; r++)
        rows[r] = (AttendRow){q + r * dim, NULL, count[r], scores + r * room, out + r * dim, 0.0f};
    if (avx512)
        attend_rows_avx512(rows, (int)R, keys, values, length, dim, scale);
    else
        attend_rows_exact(rows, (int)R, keys, values, length, dim, scale);
    free(scores), free(rows);
    return 0;
}
#endif
