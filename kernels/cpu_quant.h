/* Integer products on 8-bit weight blocks (included by cpu_decode.c, after Mat): a GGUF model's
 * weights repacked at load (specdec/packed.py) and multiplied without ever becoming floats.
 *
 * Weights: each row in blocks of 32 columns, w = scale * (q - zero) + offset, q an unsigned byte
 * and zero one integer for the whole matrix. GGUF's Q8_0, Q5_0 and Q4_0 blocks map onto this
 * exactly (offset 0, zero 128, 16 or 8), Q4_K's sub-blocks exactly too (zero 0, offset -dmin * m);
 * other formats are requantized per block.
 * The bytes lie in tiles of 16 rows: for tile T and block b, eight groups of 4 columns, each
 * group 16 rows x 4 bytes (64 bytes: one AVX-512 register, two AVX2 ones), so that one broadcast
 * of 4 activation bytes meets 16 rows at once.
 *
 * Activations: each token's row quantized per block of 32 to signed bytes, x = dx * xq, |xq| <=
 * 127, with the block's sum of xq kept. A block's contribution to y[r] is then
 *     dx * (scale * (sum q xq - zero * sum xq) + offset * sum xq),
 * the integer part exact. Its sum starts at -zero * sum xq, a number per token and block kept
 * with the quantized row (start), so that the inner loop pays no vector multiply for the zero.
 * Every variant (portable C, AVX2, AVX-512 VNNI) computes the same integers and the same float
 * operations in the same order, so they agree bit for bit, and a token's outputs do not depend
 * on what else shares its step. */

#include <stdint.h>

typedef struct {
    const uint8_t *q;     /* [tiles][blocks][8][16][4] */
    const float *scale;   /* [tiles][blocks][16] */
    const float *offset;  /* [tiles][blocks][16], or NULL: every offset 0 */
    int64_t zero;         /* the whole matrix's */
    int64_t rows, cols;   /* cols a multiple of 32; rows padded to whole tiles in the arrays */
    int64_t qmax;         /* the largest q: how AVX2's 16-bit pair sums stay clear of saturation */
} QMat;

typedef struct {          /* n tokens' rows quantized, per block of 32 */
    int8_t *xq;           /* [n][cols] */
    float *dx;            /* [n][cols / 32] */
    int32_t *start;       /* [n][cols / 32]: -zero * sum xq, where each block's integer sum starts */
    float *xs;            /* [n][cols / 32]: dx * sum, what an offset multiplies */
    int64_t cols, capacity; /* capacity: bytes of xq available (n * cols at most) */
} QAct;

enum { QKERNEL_PORTABLE = 0, QKERNEL_AVX2 = 1, QKERNEL_AVX512_VNNI = 2 };
static int qkernel = QKERNEL_PORTABLE; /* set by specdec_set_qkernel once a probe ran it */

/* Whether AVX2 multiplies the matrix's q - 128 through the sign trick (8-bit q). */
static int avx2_signs(const QMat *m) { return m->qmax > 127; }

/* The reference quantization; quantize_avx2 gives the same bytes and numbers. */
static void quantize_portable(const float *X, int64_t ldx, int64_t n, int64_t cols, int64_t zero, QAct *a) {
    const int64_t nb = cols / 32;
    a->cols = cols;
    for (int64_t t = 0; t < n; t++)
        for (int64_t b = 0; b < nb; b++) {
            const float *x = X + t * ldx + b * 32;
            float peak = 0.0f;
            for (int k = 0; k < 32; k++) peak = fabsf(x[k]) > peak ? fabsf(x[k]) : peak;
            const float d = peak / 127.0f, inverse = d > 0.0f ? 1.0f / d : 0.0f;
            int8_t *q = a->xq + t * cols + b * 32;
            int32_t sum = 0;
            for (int k = 0; k < 32; k++) sum += q[k] = (int8_t)nearbyintf(x[k] * inverse);
            a->dx[t * nb + b] = d, a->start[t * nb + b] = (int32_t)-zero * sum, a->xs[t * nb + b] = d * (float)sum;
        }
}

/* Row r of a packed matrix as floats (the embedding's lookups). */
static void qmat_row(const QMat *m, int64_t r, float *out) {
    const int64_t nb = m->cols / 32, tile = r / 16, i = r % 16;
    const float zero = (float)m->zero;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t at = tile * nb + b;
        const uint8_t *q = m->q + at * 512 + i * 4;
        const float s = m->scale[at * 16 + i], o = m->offset ? m->offset[at * 16 + i] : 0.0f;
        for (int g = 0; g < 8; g++)
            for (int k = 0; k < 4; k++) out[b * 32 + g * 4 + k] = s * ((float)q[g * 64 + k] - zero) + o;
    }
}

static void store_tile(const float *acc, int64_t row, int64_t rows, const float *bias, float *y) {
    for (int i = 0; i < 16 && row + i < rows; i++) y[row + i] = acc[i] + (bias ? bias[row + i] : 0.0f);
}

/* Tiles [T0, T1) for n tokens, one tile and one token at a time: the reference. */
static void qtiles_portable(const QMat *m, int64_t T0, int64_t T1, const QAct *a, int64_t n, float *Y, int64_t ldy,
                            const float *bias) {
    const int64_t nb = m->cols / 32;
    for (int64_t T = T0; T < T1; T++)
        for (int64_t t = 0; t < n; t++) {
            float acc[16] = {0};
            for (int64_t b = 0; b < nb; b++) {
                const int64_t at = T * nb + b;
                const uint8_t *w = m->q + at * 512;
                const int8_t *x = a->xq + t * a->cols + b * 32;
                int32_t dot[16];
                for (int i = 0; i < 16; i++) dot[i] = a->start[t * nb + b];
                for (int g = 0; g < 8; g++)
                    for (int i = 0; i < 16; i++)
                        for (int k = 0; k < 4; k++) dot[i] += (int32_t)w[g * 64 + i * 4 + k] * x[g * 4 + k];
                const float dx = a->dx[t * nb + b], xs = a->xs[t * nb + b];
                for (int i = 0; i < 16; i++) {
                    acc[i] = fmaf((float)dot[i], m->scale[at * 16 + i] * dx, acc[i]);
                    if (m->offset) acc[i] = fmaf(m->offset[at * 16 + i], xs, acc[i]);
                }
            }
            store_tile(acc, T * 16, m->rows, bias, Y + t * ldy);
        }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* The next tile's lines to fetch while this one computes. A wide pass goes over a tile once per
 * few tokens, from the cache after the first; left to the hardware's prefetcher, memory sat idle
 * through those repeats and the next tile came in only when asked for, so that reading the
 * weights and multiplying them took turns instead of overlapping. Each pass over the tile asks
 * for its share of the next tile's lines (per block: its 8 lines of q, then one of scales and
 * one of offsets), so the fetches spread over the whole tile's work. */
typedef struct {
    int64_t at;   /* the next tile's first block, or -1: no next tile in this range */
    int lo, hi;   /* the lines of each block this pass asks for, of PREFETCH_LINES */
} Prefetch;
#define PREFETCH_LINES 10

static Prefetch prefetch_share(const QMat *m, int64_t T, int64_t T1, int64_t pass, int64_t passes) {
    const Prefetch none = {-1, 0, 0};
    if (T + 1 >= T1 || pass >= PREFETCH_LINES) return none;
    const int64_t shares = passes < PREFETCH_LINES ? passes : PREFETCH_LINES;
    const Prefetch share = {(T + 1) * (m->cols / 32), (int)(pass * PREFETCH_LINES / shares),
                            (int)((pass + 1) * PREFETCH_LINES / shares)};
    return share;
}

__attribute__((always_inline)) static inline void prefetch_block(const QMat *m, Prefetch p, int64_t b) {
    if (p.at < 0) return;
    const int64_t at = p.at + b;
    for (int line = p.lo; line < p.hi; line++) {
        const char *address = line < 8  ? (const char *)(m->q + at * 512 + line * 64)
                              : line == 8 ? (const char *)(m->scale + at * 16)
                              : m->offset ? (const char *)(m->offset + at * 16)
                                          : NULL;
        if (address) _mm_prefetch(address, _MM_HINT_T0);
    }
}

#include "cpu_quant_vnni.h" /* the AVX-512 VNNI kernels */

/* AVX2: u8 x s8 byte pairs summed into 16 bits (maddubs), widened to 32 bits (madd) and added.
 * A pair's sum is at most 2 * 127 * |w|, so no 16-bit sum saturates:
 * - a matrix whose q stay within 127 multiplies them as they are, and adds the pair sums of
 *   `span` groups in 16 bits before one widening: as many groups as 32,767 / (254 * qmax) allows
 *   (8 for 4-bit q, 4 for 5-bit), which saves most of the widenings of a low-bit matrix;
 * - an 8-bit one (`qmax` above 127) multiplies w = q - 128 instead, as |w| (unsigned) times x
 *   with w's sign (the sign trick), one group at a time; its activations' start then holds
 *   -(zero - 128) * sum xq (qzero), so that the integer sum is the portable one.
 * Tokens go QTOKENS_AVX2 at a time over a tile, each loaded group of weights serving them all. */
#define AVX2 __attribute__((target("avx2,fma")))
#define QTOKENS_AVX2 4

/* quantize_portable's numbers, eight values a vector, whatever the build's flags (the portable
 * loop is vectorised only where the whole library is built with -mavx2, and then this saves
 * about 2% of a wide pass's products). The conversion rounds under the same (default, to
 * nearest even) mode, the peak is a maximum and the sum an integer sum, so nothing depends on
 * the order. */
AVX2 static void quantize_avx2(const float *X, int64_t ldx, int64_t n, int64_t cols, int64_t zero, QAct *a) {
    const int64_t nb = cols / 32;
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i in_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undoes the packs' lane interleave */
    a->cols = cols;
    for (int64_t t = 0; t < n; t++)
        for (int64_t b = 0; b < nb; b++) {
            const float *x = X + t * ldx + b * 32;
            __m256 v[4], peak8 = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + 8 * i), peak8 = _mm256_max_ps(_mm256_and_ps(v[i], magnitude), peak8);
            __m128 peak4 = _mm_max_ps(_mm256_castps256_ps128(peak8), _mm256_extractf128_ps(peak8, 1));
            peak4 = _mm_max_ps(peak4, _mm_movehl_ps(peak4, peak4));
            const float peak = _mm_cvtss_f32(_mm_max_ss(peak4, _mm_movehdup_ps(peak4)));
            const float d = peak / 127.0f, inverse = d > 0.0f ? 1.0f / d : 0.0f;
            __m256i q[4];
            for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inverse)));
            const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(a->xq + t * cols + b * 32), _mm256_permutevar8x32_epi32(bytes, in_order));
            const __m256i sum8 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            __m128i sum4 = _mm_add_epi32(_mm256_castsi256_si128(sum8), _mm256_extracti128_si256(sum8, 1));
            sum4 = _mm_add_epi32(sum4, _mm_shuffle_epi32(sum4, 0x4e));
            const int32_t sum = _mm_cvtsi128_si32(_mm_add_epi32(sum4, _mm_shuffle_epi32(sum4, 0xb1)));
            a->dx[t * nb + b] = d, a->start[t * nb + b] = (int32_t)-zero * sum, a->xs[t * nb + b] = d * (float)sum;
        }
}

static int64_t qmat_span(const QMat *m) {
    int64_t span = 8;
    while (span > 1 && span * 254 * m->qmax > 32767) span /= 2;
    return span;
}

AVX2 __attribute__((always_inline))
static inline void avx2_tile(const QMat *m, int64_t T, const QAct *a, int64_t t0, const int nt, const int span,
                             const int wide, float *Y, int64_t ldy, const float *bias, Prefetch next) {
    const int64_t nb = m->cols / 32;
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    __m256 acc[QTOKENS_AVX2][2];
    for (int j = 0; j < nt; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int64_t at = T * nb + b;
        const uint8_t *w = m->q + at * 512;
        prefetch_block(m, next, b);
        __m256i dot[QTOKENS_AVX2][2];
        for (int j = 0; j < nt; j++) dot[j][0] = dot[j][1] = _mm256_set1_epi32(a->start[(t0 + j) * nb + b]);
        for (int g0 = 0; g0 < 8; g0 += span) {
            __m256i pairs[QTOKENS_AVX2][2];
            for (int g = g0; g < g0 + span; g++) {
                __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + g * 64));
                __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + g * 64 + 32));
                const __m256i signed0 = _mm256_xor_si256(w0, flip), signed1 = _mm256_xor_si256(w1, flip);
                if (wide) w0 = _mm256_abs_epi8(signed0), w1 = _mm256_abs_epi8(signed1);
                for (int j = 0; j < nt; j++) {
                    const __m256i xb = _mm256_set1_epi32(*(const int32_t *)(a->xq + (t0 + j) * a->cols + b * 32 + g * 4));
                    const __m256i p0 = _mm256_maddubs_epi16(w0, wide ? _mm256_sign_epi8(xb, signed0) : xb);
                    const __m256i p1 = _mm256_maddubs_epi16(w1, wide ? _mm256_sign_epi8(xb, signed1) : xb);
                    pairs[j][0] = g == g0 ? p0 : _mm256_add_epi16(pairs[j][0], p0);
                    pairs[j][1] = g == g0 ? p1 : _mm256_add_epi16(pairs[j][1], p1);
                    /* Holds each sum in its register as it grows: without it gcc hoists all the
                     * tile's products ahead of their adds and keeps most of them on the stack. */
                    __asm__("" : "+x"(pairs[j][0]), "+x"(pairs[j][1]));
                }
            }
            for (int j = 0; j < nt; j++) {
                dot[j][0] = _mm256_add_epi32(dot[j][0], _mm256_madd_epi16(pairs[j][0], ones));
                dot[j][1] = _mm256_add_epi32(dot[j][1], _mm256_madd_epi16(pairs[j][1], ones));
            }
        }
        const __m256 scale0 = _mm256_loadu_ps(m->scale + at * 16), scale1 = _mm256_loadu_ps(m->scale + at * 16 + 8);
        for (int j = 0; j < nt; j++) {
            const int64_t tb = (t0 + j) * nb + b;
            const __m256 dx = _mm256_set1_ps(a->dx[tb]);
            acc[j][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[j][0]), _mm256_mul_ps(scale0, dx), acc[j][0]);
            acc[j][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[j][1]), _mm256_mul_ps(scale1, dx), acc[j][1]);
            if (m->offset) {
                const __m256 xs = _mm256_set1_ps(a->xs[tb]);
                acc[j][0] = _mm256_fmadd_ps(_mm256_loadu_ps(m->offset + at * 16), xs, acc[j][0]);
                acc[j][1] = _mm256_fmadd_ps(_mm256_loadu_ps(m->offset + at * 16 + 8), xs, acc[j][1]);
            }
        }
    }
    for (int j = 0; j < nt; j++) {
        float out[16];
        _mm256_storeu_ps(out, acc[j][0]), _mm256_storeu_ps(out + 8, acc[j][1]);
        store_tile(out, T * 16, m->rows, bias, Y + (t0 + j) * ldy);
    }
}

/* One loop per (span, wide), chosen once a matrix, over instances for 1 to 4 tokens, so that
 * each loop above unrolls with its bounds known. */
#define AVX2_TILES(SPAN, WIDE)                                                                         \
    AVX2 static void avx2_tiles_##SPAN##_##WIDE(const QMat *m, int64_t T0, int64_t T1, const QAct *a, int64_t n, \
                                                float *Y, int64_t ldy, const float *bias) {            \
        const int64_t passes = (n + QTOKENS_AVX2 - 1) / QTOKENS_AVX2;                                 \
        for (int64_t T = T0; T < T1; T++)                                                              \
            for (int64_t t0 = 0; t0 < n; t0 += QTOKENS_AVX2) {                                         \
                const Prefetch next = prefetch_share(m, T, T1, t0 / QTOKENS_AVX2, passes);             \
                switch (n - t0 >= QTOKENS_AVX2 ? QTOKENS_AVX2 : n - t0) {                              \
                case 4: avx2_tile(m, T, a, t0, 4, SPAN, WIDE, Y, ldy, bias, next); break;              \
                case 3: avx2_tile(m, T, a, t0, 3, SPAN, WIDE, Y, ldy, bias, next); break;              \
                case 2: avx2_tile(m, T, a, t0, 2, SPAN, WIDE, Y, ldy, bias, next); break;              \
                default: avx2_tile(m, T, a, t0, 1, SPAN, WIDE, Y, ldy, bias, next);                    \
                }                                                                                      \
            }                                                                                          \
    }
AVX2_TILES(1, 1)
AVX2_TILES(1, 0)
AVX2_TILES(2, 0)
AVX2_TILES(4, 0)
AVX2_TILES(8, 0)

static void qtiles_avx2(const QMat *m, int64_t T0, int64_t T1, const QAct *a, int64_t n, float *Y, int64_t ldy,
                        const float *bias) {
    if (avx2_signs(m)) return avx2_tiles_1_1(m, T0, T1, a, n, Y, ldy, bias);
    switch (qmat_span(m)) {
    case 8: return avx2_tiles_8_0(m, T0, T1, a, n, Y, ldy, bias);
    case 4: return avx2_tiles_4_0(m, T0, T1, a, n, Y, ldy, bias);
    case 2: return avx2_tiles_2_0(m, T0, T1, a, n, Y, ldy, bias);
    default: return avx2_tiles_1_0(m, T0, T1, a, n, Y, ldy, bias);
    }
}
#endif

/* The vector kernels run on CPUs with AVX2, so their activations are quantized with it. */
static void quantize_activations(const float *X, int64_t ldx, int64_t n, int64_t cols, int64_t zero, QAct *a,
                                 int kernel) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (kernel != QKERNEL_PORTABLE) return quantize_avx2(X, ldx, n, cols, zero, a);
#endif
    quantize_portable(X, ldx, n, cols, zero, a);
}

static void qtiles(const QMat *m, int64_t T0, int64_t T1, const QAct *a, int64_t n, float *Y, int64_t ldy,
                   const float *bias, int kernel) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (kernel == QKERNEL_AVX512_VNNI) return qtiles_avx512_vnni(m, T0, T1, a, n, Y, ldy, bias);
    if (kernel == QKERNEL_AVX2) return qtiles_avx2(m, T0, T1, a, n, Y, ldy, bias);
#endif
    qtiles_portable(m, T0, T1, a, n, Y, ldy, bias);
}

/* The zero the activations' start is taken with: AVX2 multiplies an 8-bit matrix's q - 128. */
static int64_t qzero(const QMat *m, int kernel) {
    return kernel == QKERNEL_AVX2 && avx2_signs(m) ? m->zero - 128 : m->zero;
}

/* Tiles [T0, T1) of Y = X W^T (+ bias): the activations quantized into `a`, then multiplied. */
static void qproduct(const QMat *m, const float *X, int64_t ldx, QAct *a, int64_t n, int64_t T0, int64_t T1,
                     float *Y, int64_t ldy, const float *bias, int kernel) {
    quantize_activations(X, ldx, n, m->cols, qzero(m, kernel), a, kernel);
    qtiles(m, T0, T1, a, n, Y, ldy, bias, kernel);
}

/* Each thread's own activation buffer: the threads of a step quantize the same rows, which
 * costs less than a barrier for a decode step's few hundred values. */
static __thread QAct *thread_qact;

/* Rows [r0, r1) (whole tiles, but the last) of Y = X W^T (+ bias) on the packed matrix. */
static void qgemm_rows(const QMat *m, const float *X, int64_t ldx, float *Y, int64_t ldy, int64_t n,
                       const float *bias, int64_t r0, int64_t r1) {
    qproduct(m, X, ldx, thread_qact, n, r0 / 16, (r1 + 15) / 16, Y, ldy, bias, qkernel);
}

/* The bytes a thread's QAct needs for n rows of `cols` (laid out after the struct). */
static size_t qact_bytes(int64_t n, int64_t cols) {
    return sizeof(QAct) + (size_t)(n * cols) + (size_t)(n * (cols / 32)) * 12 + 64;
}

static QAct *qact_at(void *memory, int64_t n, int64_t cols) {
    QAct *a = memory;
    const int64_t blocks = n * (cols / 32);
    a->dx = (float *)(a + 1), a->xs = a->dx + blocks, a->start = (int32_t *)(a->xs + blocks);
    a->xq = (int8_t *)(a->start + blocks), a->capacity = n * cols, a->cols = cols;
    return a;
}

void specdec_set_qkernel(int kernel) { qkernel = kernel; }

/* Runs `kernel` on small random products and compares them with the portable one's: 0 when they
 * agree. Two matrices, 5-bit q (zero 16) with offsets and 8-bit q (zero 128), and passes of 11,
 * 7, 4 and 3 tokens, so that each of a kernel's paths runs. Called in a child process first
 * (specdec_kernels/cpu_decode.py), where an instruction the CPU refuses kills only the child. */
int specdec_qkernel_probe(int kernel) {
    enum { ROWS = 20, COLS = 64, N = 11 };
    const int64_t passes[4] = {N, 7, 4, 3};
    static uint8_t q[2 * (COLS / 32) * 512]; /* 2 tiles of 16 rows */
    static float scale[2 * 16 * 2], offset[2 * 16 * 2], X[N * COLS], Y0[N * ROWS], Y1[N * ROWS];
    static int8_t xq[N * COLS];
    static float dx[N * 2], xs[N * 2];
    static int32_t starts[N * 2];
    uint32_t state = 12345u;
    for (int i = 0; i < 64; i++) scale[i] = 0.01f * (float)(i % 7 + 1), offset[i] = -0.003f * (float)(i % 5);
    for (int i = 0; i < N * COLS; i++) X[i] = (float)((int)((state = state * 1103515245u + 12345u) >> 24) - 128) / 37.0f;
    const int bits[2] = {5, 8};
    for (int c = 0; c < 2; c++) {
        for (size_t i = 0; i < sizeof q; i++) q[i] = (uint8_t)((state = state * 1103515245u + 12345u) >> (32 - bits[c]));
        q[0] = (uint8_t)((1 << bits[c]) - 1), q[1] = 0; /* both ends of the range */
        QMat m = {q, scale, c ? NULL : offset, c ? 128 : 16, ROWS, COLS, (1 << bits[c]) - 1};
        QAct a = {xq, dx, starts, xs, COLS, N * COLS};
        for (int p = 0; p < 4; p++) {
            qproduct(&m, X, COLS, &a, passes[p], 0, 2, Y0, ROWS, NULL, QKERNEL_PORTABLE);
            qproduct(&m, X, COLS, &a, passes[p], 0, 2, Y1, ROWS, NULL, kernel);
            if (memcmp(Y0, Y1, (size_t)passes[p] * ROWS * sizeof(float)) != 0) return 1;
        }
    }
    return 0;
}

/* Y [n, rows] = X [n, cols] W^T on a packed matrix with `kernel`, over `threads` threads: the
 * product alone, for tests and benchmarks. Returns -1 when memory is lacking. */
int specdec_qgemm(const QMat *m, const float *X, int64_t n, float *Y, int kernel, int threads) {
    const size_t stride = (qact_bytes(n, m->cols) + 63) / 64 * 64;
    char *memory = malloc(stride * (size_t)threads);
    if (!memory) return -1;
    const int64_t tiles = (m->rows + 15) / 16;
#pragma omp parallel num_threads(threads)
    {
        QAct *a = qact_at(memory + stride * (size_t)omp_get_thread_num(), n, m->cols);
        const int64_t me = omp_get_thread_num(), all = omp_get_num_threads();
        qproduct(m, X, m->cols, a, n, tiles * me / all, tiles * (me + 1) / all, Y, m->rows, NULL, kernel);
    }
    free(memory);
    return 0;
}
