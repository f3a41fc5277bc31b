/* Causal attention for a long run of new tokens on the CPU: a prompt, or a prompt's chunk after
 * its cached rows. Included by cpu_decode.c after cpu_decode_vector.h (it uses exp8).
 *
 * PyTorch's CPU flash kernel is slow at the narrow heads of small models: at a head width of 32,
 * a 1,000-token prompt's attention cost as much as all its products. Here the pairs go
 * through register tiles: scores as 6 queries by 16 keys, the products' own input-major tile (the
 * keys transposed once per call, so each d step is two loads of keys, six broadcasts and twelve
 * FMAs), the online softmax a block
 * of keys at a time, and the weighted values as 3 queries by 32 dimensions. Queries are taken in
 * units of one kv head and a block of consecutive tokens (the group's heads of each), which the
 * threads share out, the longest first, since later tokens see more keys.
 *
 * Unlike the decode step's attention, this one does not fix its order of summation per token:
 * a prompt's rows are computed once, and the step that decodes after them reads only their
 * keys and values. It agrees with exact attention within float rounding. */
#if defined(__AVX2__) && defined(__FMA__)
#define PF_QUERY_TOKENS 32 /* consecutive tokens per unit of work */
#define PF_KEY_BLOCK KEY_CHUNK /* keys per block of the online softmax (64: a multiple of 16) */

typedef struct {
    const float *kt;     /* this kv head's keys, sixteen at a time transposed: kt[(key / 16 * dim + d) * 16 + key % 16] */
    const float *values; /* [keys, dim] rows */
    int64_t dim;
} PrefillHead;

/* o[m][c .. c + 8 V) += sum_{j < keys} p[m][j] values[j][c ..] for M rows. */
static inline __attribute__((always_inline)) void pf_weigh_tile(const float *p, int64_t p_stride, const float *values,
                                                                int64_t dim, int64_t keys, float *o, int64_t c,
                                                                const int M, const int V) {
    __m256 acc[3][4];
#pragma GCC unroll 3
    for (int m = 0; m < M; m++)
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) acc[m][v] = _mm256_loadu_ps(o + m * dim + c + 8 * v);
    for (int64_t j = 0; j < keys; j++) {
        const float *row = values + j * dim + c;
        __m256 val[4];
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) val[v] = _mm256_loadu_ps(row + 8 * v);
#pragma GCC unroll 3
        for (int m = 0; m < M; m++) {
            const __m256 pj = _mm256_broadcast_ss(p + m * p_stride + j);
#pragma GCC unroll 4
            for (int v = 0; v < V; v++) acc[m][v] = _mm256_fmadd_ps(pj, val[v], acc[m][v]);
        }
    }
#pragma GCC unroll 3
    for (int m = 0; m < M; m++)
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) _mm256_storeu_ps(o + m * dim + c + 8 * v, acc[m][v]);
}

/* pf_weigh_tile with the width V (1 to 4 vectors) a compile-time constant. */
static inline __attribute__((always_inline)) void pf_weigh_tiles(const float *p, int64_t p_stride,
                                                                  const float *values, int64_t dim, int64_t keys,
                                                                  float *o, int64_t c, const int M, int V) {
    switch (V) {
    case 4: pf_weigh_tile(p, p_stride, values, dim, keys, o, c, M, 4); break;
    case 3: pf_weigh_tile(p, p_stride, values, dim, keys, o, c, M, 3); break;
    case 2: pf_weigh_tile(p, p_stride, values, dim, keys, o, c, M, 2); break;
    default: pf_weigh_tile(p, p_stride, values, dim, keys, o, c, M, 1); break;
    }
}

/* The weighted values of `rows` rows, 32 dimensions at a time, three rows a tile, then one by one. */
static void pf_weigh_rows(const float *p, int64_t p_stride, const float *values, int64_t dim, int64_t keys, float *o,
                          int rows) {
    for (int64_t c = 0; c < dim; c += 32) {
        const int V = dim - c >= 32 ? 4 : (int)((dim - c) / 8);
        int r = 0;
        for (; r + 3 <= rows; r += 3) pf_weigh_tiles(p + r * p_stride, p_stride, values, dim, keys, o + r * dim, c, 3, V);
        for (; r < rows; r++) pf_weigh_tiles(p + r * p_stride, p_stride, values, dim, keys, o + r * dim, c, 1, V);
    }
}

/* One block of keys [key, key + PF_KEY_BLOCK) for R rows: scores, the causal mask (row r sees
 * keys below limit[r]), the online softmax's rescaling, and the weighted values. */
static void pf_key_block(const float *q, int R, const int64_t *limit, const PrefillHead *h, int64_t key, float *s,
                         float *o, float *peak, float *total) {
    const int64_t S = PF_KEY_BLOCK, dim = h->dim;
    int64_t reach = 0; /* keys of the block any row sees */
    for (int r = 0; r < R; r++) reach = limit[r] - key > reach ? limit[r] - key : reach;
    reach = reach < S ? reach : S;
    const int64_t tiles = (reach + 15) / 16;
    /* a tile of sixteen keys is an input-major matrix product: the queries' dimensions against
     * the keys' transposed rows, six queries at a time */
    for (int64_t t = 0; t < tiles; t++)
        tiles_input_major(h->kt + (key + 16 * t) * dim, 16, dim, q, dim, s + 16 * t, S, R, 0);
    const int64_t padded = tiles * 16;
    for (int r = 0; r < R; r++) {
        float *row = s + r * S;
        for (int64_t j = limit[r] - key < 0 ? 0 : limit[r] - key; j < padded; j++) row[j] = -INFINITY;
        __m256 peaks = _mm256_set1_ps(-INFINITY);
        for (int64_t j = 0; j < padded; j += 8) peaks = _mm256_max_ps(peaks, _mm256_loadu_ps(row + j));
        float lanes[8], high = peak[r];
        _mm256_storeu_ps(lanes, peaks);
        for (int l = 0; l < 8; l++) high = lanes[l] > high ? lanes[l] : high;
        if (high == -INFINITY) continue; /* sees nothing yet: block 0 always has key 0, so never */
        if (high > peak[r]) {            /* rescale what was summed under the old peak */
            const float shrink = peak[r] == -INFINITY ? 0.0f : expf(peak[r] - high);
            total[r] *= shrink;
            for (int64_t d = 0; d < dim; d++) o[r * dim + d] *= shrink;
            peak[r] = high;
        }
        const __m256 shift = _mm256_set1_ps(high);
        __m256 sums = _mm256_setzero_ps();
        for (int64_t j = 0; j < padded; j += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), shift));
            _mm256_storeu_ps(row + j, e);
            sums = _mm256_add_ps(sums, e);
        }
        _mm256_storeu_ps(lanes, sums);
        total[r] += ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    }
    pf_weigh_rows(s, S, h->values + key * dim, dim, reach, o, R);
}
#endif

/* out[t, h, :] = softmax(q[h, t] . keys[0 .. prefix + t]) values, for the n new tokens of one
 * sequence whose keys and values are already in the cache after its `prefix` committed rows.
 * q[h, t, d] at q + h * q_head + t * q_token + d; keys/values [kv_heads][capacity][dim];
 * out [n][heads][dim]. Returns 0, or -1 where this build has no such kernel (no AVX2 and FMA,
 * or a head width that is not a multiple of 8): the caller computes it another way. */
int specdec_causal_attention(const float *q, int64_t q_head, int64_t q_token, const float *keys, const float *values,
                             int64_t capacity, float *out, int64_t heads, int64_t kv_heads, int64_t n, int64_t prefix,
                             int64_t dim, float scale, int threads) {
#if defined(__AVX2__) && defined(__FMA__)
    if (dim % 8 != 0 || heads % kv_heads != 0 || n < 1) return -1;
    const int64_t group = heads / kv_heads, length = prefix + n;
    const int64_t chunks = (length + PF_KEY_BLOCK - 1) / PF_KEY_BLOCK, kt_stride = chunks * PF_KEY_BLOCK * dim;
    const int64_t blocks = (n + PF_QUERY_TOKENS - 1) / PF_QUERY_TOKENS, units = blocks * kv_heads;
    const int64_t R_max = PF_QUERY_TOKENS * group;
    const int64_t floats_per_thread = R_max * (2 * dim + PF_KEY_BLOCK + 2); /* queries, sums, scores, peaks, totals */
    float *kt = (float *)malloc(sizeof(float) * (size_t)(kv_heads * kt_stride));
    float *work = (float *)malloc(sizeof(float) * (size_t)(threads * floats_per_thread));
    int64_t *limits = (int64_t *)malloc(sizeof(int64_t) * (size_t)(threads * R_max));
    if (!kt || !work || !limits) {
        free(kt), free(work), free(limits);
        return -1;
    }
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t c = 0; c < kv_heads * chunks; c++) { /* transpose_chunk's chunks are PF_KEY_BLOCK keys */
            const int64_t hk = c / chunks, at = c % chunks * PF_KEY_BLOCK;
            transpose_chunk(keys + (hk * capacity + at) * dim, length - at < PF_KEY_BLOCK ? length - at : PF_KEY_BLOCK,
                            dim, kt + hk * kt_stride + at * dim, 16);
        }
        float *qs = work + omp_get_thread_num() * floats_per_thread;
        float *o = qs + R_max * dim, *s = o + R_max * dim, *peak = s + R_max * PF_KEY_BLOCK, *total = peak + R_max;
        int64_t *limit = limits + omp_get_thread_num() * R_max;
        /* the last blocks of tokens first: they see the most keys */
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < units; u++) {
            const int64_t block = blocks - 1 - u / kv_heads, hk = u % kv_heads;
            const int64_t t0 = block * PF_QUERY_TOKENS;
            const int64_t t1 = t0 + PF_QUERY_TOKENS < n ? t0 + PF_QUERY_TOKENS : n;
            const int R = (int)((t1 - t0) * group);
            for (int r = 0; r < R; r++) { /* row r: token t0 + r / group, head hk * group + r % group */
                const int64_t t = t0 + r / group, head = hk * group + r % group;
                const float *src = q + head * q_head + t * q_token;
                for (int64_t d = 0; d < dim; d++) qs[r * dim + d] = src[d] * scale;
                limit[r] = prefix + t + 1;
                peak[r] = -INFINITY;
                total[r] = 0.0f;
            }
            memset(o, 0, sizeof(float) * (size_t)(R * dim));
            const PrefillHead h = {kt + hk * kt_stride, values + hk * capacity * dim, dim};
            for (int64_t key = 0; key < prefix + t1; key += PF_KEY_BLOCK)
                pf_key_block(qs, R, limit, &h, key, s, o, peak, total);
            for (int r = 0; r < R; r++) {
                const int64_t t = t0 + r / group, head = hk * group + r % group;
                const float inverse = 1.0f / total[r];
                for (int64_t d = 0; d < dim; d++) out[(t * heads + head) * dim + d] = o[r * dim + d] * inverse;
            }
        }
    }
    free(work);
    free(limits);
    free(kt);
    return 0;
#else
    (void)q, (void)q_head, (void)q_token, (void)keys, (void)values, (void)capacity, (void)out, (void)heads;
    (void)kv_heads, (void)n, (void)prefix, (void)dim, (void)scale, (void)threads;
    return -1;
#endif
}
