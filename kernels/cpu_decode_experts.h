/* The experts of cpu_decode.c (included by it): routing, and the SwiGLU products of the experts (or
 * the dense MLP) by (token, slot) pair, by expert, or by rows of one token's experts. */

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

/* The experts' (or the dense MLP's) share of the layer for n > 1 tokens: each (token, slot)
 * pair's whole SwiGLU on one thread, pairs sorted by expert so that a thread's consecutive
 * pairs read the same weights. act [pairs, 2I], out [pairs, H]. */
static void experts_by_pair(const Model *m, const Layer *layer, const float *normed, int64_t n, int64_t slots,
                            const int64_t *ids, const int64_t *order, float *act, float *out) {
    const int64_t H = m->hidden, I = m->intermediate;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n * slots; i++) {
        const int64_t pair = order[i], t = pair / slots, e = ids[pair];
        const Mat gate = expert(&layer->gate, e, layer->gate_up_expert_stride);
        const Mat up = expert(&layer->up, e, layer->gate_up_expert_stride);
        const Mat down = expert(&layer->down, e, layer->down_expert_stride);
        float *g = act + 2 * I * pair, *u = g + I;
        gemm_rows(&gate, normed + t * H, H, g, I, 1, NULL, 0, gate.rows);
        gemm_rows(&up, normed + t * H, H, u, I, 1, NULL, 0, up.rows);
        for (int64_t r = 0; r < gate.rows; r++) g[r] = silu(g[r]) * u[r];
        gemm_rows(&down, g, I, out + H * pair, H, 1, NULL, 0, down.rows);
    }
}

/* Several tokens' experts, expert by expert: each expert's tokens (gathered, in `order`)
 * through its projections at once, with the rows split over the threads, so that each
 * expert's weights are read once per step. gathered [pairs, H]; out [pairs, H] by position
 * in `order`. */
static void experts_by_expert(const Model *m, const Layer *layer, int64_t n, int64_t slots, const int64_t *ids,
                              const int64_t *order, const float *gathered, float *act, float *out) {
    const int64_t H = m->hidden, I = m->intermediate, experts = layer->num_experts ? layer->num_experts : 1;
    int64_t start = 0;
    for (int64_t e = 0; e < experts && start < n * slots; e++) {
        int64_t end = start;
        while (end < n * slots && ids[order[end]] == e) end++;
        if (end == start) continue;
        const int64_t rows = end - start;
        const Mat gate = expert(&layer->gate, e, layer->gate_up_expert_stride);
        const Mat up = expert(&layer->up, e, layer->gate_up_expert_stride);
        const Mat down = expert(&layer->down, e, layer->down_expert_stride);
        float *g = act + 2 * I * start, *u = g + I; /* row i of each at stride 2I */
        int64_t r0, r1;
        share(gate.rows, &r0, &r1);
        if (r0 < r1) {
            gemm_rows(&gate, gathered + start * H, H, g, 2 * I, rows, NULL, r0, r1);
            gemm_rows(&up, gathered + start * H, H, u, 2 * I, rows, NULL, r0, r1);
            for (int64_t i = 0; i < rows; i++)
                for (int64_t r = r0; r < r1; r++) g[i * 2 * I + r] = silu(g[i * 2 * I + r]) * u[i * 2 * I + r];
        }
#pragma omp barrier
        gemm(&down, g, 2 * I, out + start * H, H, rows, NULL);
        start = end;
    }
}

/* One token's experts with each projection's rows split over the threads (decode: fewer
 * pairs than threads would leave threads idle). */
static void experts_by_rows(const Model *m, const Layer *layer, const float *normed, int64_t slots,
                            const int64_t *ids, float *act, float *out) {
    const int64_t H = m->hidden, I = m->intermediate;
    for (int64_t s = 0; s < slots; s++) {
        const Mat gate = expert(&layer->gate, ids[s], layer->gate_up_expert_stride);
        const Mat up = expert(&layer->up, ids[s], layer->gate_up_expert_stride);
        const Mat down = expert(&layer->down, ids[s], layer->down_expert_stride);
        float *g = act + 2 * I * s, *u = g + I;
        int64_t r0, r1;
        share(gate.rows, &r0, &r1);
        if (r0 < r1) {
            gemm_rows(&gate, normed, H, g, I, 1, NULL, r0, r1);
            gemm_rows(&up, normed, H, u, I, 1, NULL, r0, r1);
            for (int64_t r = r0; r < r1; r++) g[r] = silu(g[r]) * u[r];
        }
#pragma omp barrier
        gemm(&down, g, I, out + H * s, H, 1, NULL);
    }
}

/* Routing of each token (serial): ids and weights [n, slots], and the pairs' order by expert. */
static void route_tokens(const Model *m, const Layer *layer, const float *normed, int64_t n, float *router_logits,
                         int64_t *ids, float *weights, int64_t *order) {
    const int64_t H = m->hidden, slots = layer->num_experts ? m->top_k : 1;
    for (int64_t t = 0; t < n; t++) {
        if (!layer->num_experts) {
            ids[t] = 0, weights[t] = 1.0f;
            continue;
        }
        for (int64_t e = 0; e < layer->num_experts; e++)
            router_logits[e] = dot(layer->router.w + e * layer->router.s_row, normed + t * H, H) +
                               (layer->router_bias ? layer->router_bias[e] : 0.0f);
        route(m, router_logits, layer->num_experts, ids + t * slots, weights + t * slots);
    }
    int64_t next = 0; /* a counting sort of the pairs by expert */
    const int64_t experts = layer->num_experts ? layer->num_experts : 1;
    for (int64_t e = 0; e < experts; e++)
        for (int64_t pair = 0; pair < n * slots; pair++)
            if (ids[pair] == e) order[next++] = pair;
}
