/* The AVX-512 VNNI products on packed 8-bit blocks (included by cpu_quant.h, after the layout,
 * QMat, QAct and the prefetch shares): u8 x s8 groups of 4 summed into 32 bits by one
 * instruction, 16 rows of a tile per register. Each kernel computes the portable loop's integers
 * and float operations in its order, so every width agrees with it bit for bit. */
#define QTOKENS 4 /* tokens per pass over a tile: each weight register serves them all */
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

/* A token's integer sum over a block into its 16 rows' floats: the portable loop's float
 * operations, in its order. `tb` indexes the token's per-block numbers (t * blocks + b); the
 * block's scales and offsets come loaded, once for all the tokens. */
VNNI __attribute__((always_inline))
static inline __m512 vnni_add_block(const QMat *m, const QAct *a, int64_t tb, __m512 scale, __m512 offset,
                                    __m512i dot, __m512 acc) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale, _mm512_set1_ps(a->dx[tb])), acc);
    if (m->offset) acc = _mm512_fmadd_ps(offset, _mm512_set1_ps(a->xs[tb]), acc);
    return acc;
}

VNNI __attribute__((always_inline))
static inline void vnni_store(const __m512 *acc, int nt, const QMat *m, int64_t T, int64_t t0, float *Y, int64_t ldy,
                              const float *bias) {
    for (int j = 0; j < nt; j++) {
        float out[16];
        _mm512_storeu_ps(out, acc[j]);
        store_tile(out, T * 16, m->rows, bias, Y + (t0 + j) * ldy);
    }
}

/* One tile for QTOKENS tokens. Each token's sum runs as two chains of four products (even and
 * odd groups), interleaved across the tokens: one chain of eight made each product wait on the
 * one before it. The sums are integers, exact in any order. */
VNNI
static void qtile_avx512_vnni_full(const QMat *m, int64_t T, const QAct *a, int64_t t0, float *Y, int64_t ldy,
                                   const float *bias, Prefetch next) {
    const int64_t nb = m->cols / 32;
    __m512 acc[QTOKENS];
    for (int j = 0; j < QTOKENS; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int64_t at = T * nb + b;
        const uint8_t *w = m->q + at * 512;
        prefetch_block(m, next, b);
        __m512i wg[8], even[QTOKENS], odd[QTOKENS];
        for (int g = 0; g < 8; g++) wg[g] = _mm512_loadu_si512(w + g * 64);
        for (int j = 0; j < QTOKENS; j++)
            even[j] = _mm512_set1_epi32(a->start[(t0 + j) * nb + b]), odd[j] = _mm512_setzero_si512();
        for (int g = 0; g < 8; g += 2)
            for (int j = 0; j < QTOKENS; j++) {
                const int8_t *x = a->xq + (t0 + j) * a->cols + b * 32 + g * 4;
                even[j] = _mm512_dpbusd_epi32(even[j], wg[g], _mm512_set1_epi32(*(const int32_t *)x));
                odd[j] = _mm512_dpbusd_epi32(odd[j], wg[g + 1], _mm512_set1_epi32(*(const int32_t *)(x + 4)));
            }
        const __m512 scale = _mm512_loadu_ps(m->scale + at * 16);
        const __m512 offset = m->offset ? _mm512_loadu_ps(m->offset + at * 16) : _mm512_setzero_ps();
        for (int j = 0; j < QTOKENS; j++)
            acc[j] = vnni_add_block(m, a, (t0 + j) * nb + b, scale, offset, _mm512_add_epi32(even[j], odd[j]), acc[j]);
    }
    vnni_store(acc, QTOKENS, m, T, t0, Y, ldy, bias);
}

/* One tile for fewer than QTOKENS tokens (a decode step's one, a short tree's few): one chain of
 * eight products per token, which measured faster than the split chains at one and two tokens,
 * where the weights' loads, not the products, bound the kernel. */
VNNI
static void qtile_avx512_vnni_few(const QMat *m, int64_t T, const QAct *a, int64_t t0, int nt, float *Y,
                                  int64_t ldy, const float *bias, Prefetch next) {
    const int64_t nb = m->cols / 32;
    __m512 acc[QTOKENS];
    for (int j = 0; j < QTOKENS; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int64_t at = T * nb + b;
        const uint8_t *w = m->q + at * 512;
        prefetch_block(m, next, b);
        __m512i wg[8];
        for (int g = 0; g < 8; g++) wg[g] = _mm512_loadu_si512(w + g * 64);
        const __m512 scale = _mm512_loadu_ps(m->scale + at * 16);
        const __m512 offset = m->offset ? _mm512_loadu_ps(m->offset + at * 16) : _mm512_setzero_ps();
        for (int j = 0; j < nt; j++) {
            const int64_t t = t0 + j;
            const int8_t *x = a->xq + t * a->cols + b * 32;
            __m512i dot = _mm512_set1_epi32(a->start[t * nb + b]);
            for (int g = 0; g < 8; g++)
                dot = _mm512_dpbusd_epi32(dot, wg[g], _mm512_set1_epi32(*(const int32_t *)(x + g * 4)));
            acc[j] = vnni_add_block(m, a, t * nb + b, scale, offset, dot, acc[j]);
        }
    }
    vnni_store(acc, nt, m, T, t0, Y, ldy, bias);
}

/* Two neighbouring tiles for QTOKENS tokens: each broadcast of 4 activation bytes meets 32 rows,
 * which halves the broadcasts a product needs. Each token's sum in each tile is one chain of
 * eight products; the eight chains are independent. */
VNNI
static void qtile_pair_avx512_vnni(const QMat *m, int64_t T, const QAct *a, int64_t t0, float *Y, int64_t ldy,
                                   const float *bias, Prefetch next0, Prefetch next1) {
    const int64_t nb = m->cols / 32;
    const int8_t *x0 = a->xq + t0 * a->cols;
    const int64_t ldx = a->cols;
    __m512 acc0[QTOKENS], acc1[QTOKENS];
    for (int j = 0; j < QTOKENS; j++) acc0[j] = acc1[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int64_t at = T * nb + b;
        const uint8_t *w0 = m->q + at * 512, *w1 = w0 + nb * 512;
        prefetch_block(m, next0, b);
        prefetch_block(m, next1, b);
        __m512i dot0[QTOKENS], dot1[QTOKENS];
        for (int j = 0; j < QTOKENS; j++) dot0[j] = dot1[j] = _mm512_set1_epi32(a->start[(t0 + j) * nb + b]);
        for (int g = 0; g < 8; g++) {
            const __m512i wa = _mm512_loadu_si512(w0 + g * 64), wb = _mm512_loadu_si512(w1 + g * 64);
            for (int j = 0; j < QTOKENS; j++) {
                const __m512i xb = _mm512_set1_epi32(*(const int32_t *)(x0 + j * ldx + b * 32 + g * 4));
                dot0[j] = _mm512_dpbusd_epi32(dot0[j], wa, xb);
                dot1[j] = _mm512_dpbusd_epi32(dot1[j], wb, xb);
            }
        }
        const __m512 scale0 = _mm512_loadu_ps(m->scale + at * 16), scale1 = _mm512_loadu_ps(m->scale + (at + nb) * 16);
        const __m512 offset0 = m->offset ? _mm512_loadu_ps(m->offset + at * 16) : _mm512_setzero_ps();
        const __m512 offset1 = m->offset ? _mm512_loadu_ps(m->offset + (at + nb) * 16) : _mm512_setzero_ps();
        for (int j = 0; j < QTOKENS; j++) {
            acc0[j] = vnni_add_block(m, a, (t0 + j) * nb + b, scale0, offset0, dot0[j], acc0[j]);
            acc1[j] = vnni_add_block(m, a, (t0 + j) * nb + b, scale1, offset1, dot1[j], acc1[j]);
        }
    }
    vnni_store(acc0, QTOKENS, m, T, t0, Y, ldy, bias);
    vnni_store(acc1, QTOKENS, m, T + 1, t0, Y, ldy, bias);
}

/* One tile for 5 to 8 tokens (a verify pass of a small tree), in one pass over the weights:
 * each loaded group of 16 rows serves every token, as eight independent chains. Two passes of
 * four tokens read the tile twice, and the second pass's products did not overlap the memory
 * traffic the way the first pass's did: a fifth token cost nearly as much as four more. */
#define QTOKENS_WIDE 8
VNNI __attribute__((always_inline))
static inline void qtile_avx512_vnni_wide(const QMat *m, int64_t T, const QAct *a, const int nt, float *Y,
                                          int64_t ldy, const float *bias, Prefetch next) {
    const int64_t nb = m->cols / 32;
    const int8_t *x0 = a->xq;
    const int64_t ldx = a->cols;
    __m512 acc[QTOKENS_WIDE];
    for (int j = 0; j < nt; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int64_t at = T * nb + b;
        const uint8_t *w = m->q + at * 512;
        prefetch_block(m, next, b);
        __m512i dot[QTOKENS_WIDE];
        for (int j = 0; j < nt; j++) dot[j] = _mm512_set1_epi32(a->start[j * nb + b]);
        for (int g = 0; g < 8; g++) {
            const __m512i wg = _mm512_loadu_si512(w + g * 64);
            for (int j = 0; j < nt; j++)
                dot[j] = _mm512_dpbusd_epi32(dot[j], wg,
                                             _mm512_set1_epi32(*(const int32_t *)(x0 + j * ldx + b * 32 + g * 4)));
        }
        const __m512 scale = _mm512_loadu_ps(m->scale + at * 16);
        const __m512 offset = m->offset ? _mm512_loadu_ps(m->offset + at * 16) : _mm512_setzero_ps();
        for (int j = 0; j < nt; j++)
            acc[j] = vnni_add_block(m, a, j * nb + b, scale, offset, dot[j], acc[j]);
    }
    vnni_store(acc, nt, m, T, 0, Y, ldy, bias);
}

/* 5 to QTOKENS_WIDE tokens, each width its own specialisation so that the chains stay in
 * registers. */
VNNI
static void qtile_avx512_vnni_wide_n(const QMat *m, int64_t T, const QAct *a, int nt, float *Y, int64_t ldy,
                                     const float *bias, Prefetch next) {
    switch (nt) {
    case 5: return qtile_avx512_vnni_wide(m, T, a, 5, Y, ldy, bias, next);
    case 6: return qtile_avx512_vnni_wide(m, T, a, 6, Y, ldy, bias, next);
    case 7: return qtile_avx512_vnni_wide(m, T, a, 7, Y, ldy, bias, next);
    default: return qtile_avx512_vnni_wide(m, T, a, 8, Y, ldy, bias, next);
    }
}

/* Fewer than QTOKENS tokens (a decode step's one): single tiles, bound by the weights' reads.
 * Exactly QTOKENS, or more than QTOKENS_WIDE: tiles in pairs, each pair once per QTOKENS tokens;
 * past QTOKENS_WIDE the products bind, and the pairs' shared broadcasts pay. Between the two:
 * each tile once, for all the tokens. */
VNNI
static void qtiles_avx512_vnni(const QMat *m, int64_t T0, int64_t T1, const QAct *a, int64_t n, float *Y,
                               int64_t ldy, const float *bias) {
    if (n > QTOKENS && n <= QTOKENS_WIDE) {
        for (int64_t T = T0; T < T1; T++)
            qtile_avx512_vnni_wide_n(m, T, a, (int)n, Y, ldy, bias, prefetch_share(m, T, T1, 0, 1));
        return;
    }
    const int64_t passes = (n + QTOKENS - 1) / QTOKENS;
    int64_t T = T0;
    for (; T + 1 < T1 && n >= QTOKENS; T += 2)
        for (int64_t t0 = 0; t0 < n; t0 += QTOKENS) {
            const Prefetch next0 = prefetch_share(m, T + 1, T1, t0 / QTOKENS, passes);
            const Prefetch next1 = prefetch_share(m, T + 2, T1, t0 / QTOKENS, passes);
            if (n - t0 >= QTOKENS) {
                qtile_pair_avx512_vnni(m, T, a, t0, Y, ldy, bias, next0, next1);
            } else {
                qtile_avx512_vnni_few(m, T, a, t0, (int)(n - t0), Y, ldy, bias, next0);
                qtile_avx512_vnni_few(m, T + 1, a, t0, (int)(n - t0), Y, ldy, bias, next1);
            }
        }
    for (; T < T1; T++)
        for (int64_t t0 = 0; t0 < n; t0 += QTOKENS) {
            const Prefetch next = prefetch_share(m, T, T1, t0 / QTOKENS, passes);
            if (n - t0 >= QTOKENS)
                qtile_avx512_vnni_full(m, T, a, t0, Y, ldy, bias, next);
            else
                qtile_avx512_vnni_few(m, T, a, t0, (int)(n - t0), Y, ldy, bias, next);
        }
}
