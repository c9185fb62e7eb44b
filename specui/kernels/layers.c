/* ---- Decoder layers in one call: the gguf verifier's, and the drafters' ----------------------
 *
 * A one-token gguf step is a stream through 60 MB of blocks (~13 ms at one core's bandwidth), yet
 * it took ~27 ms through `specui.verifier.decoder`'s torch ops: per layer some 35 of them (norms,
 * rotary, the KV writes, SiLU, residual adds, views) at a few microseconds each, plus their
 * allocations.  `specui_decoder_layers` runs every layer of a block of rows (a one-token step or a
 * verify block) on the other files' kernels with no torch in between: RMSNorm, the fused q/k/v matmul
 * (and its bias), Qwen3's per-head q/k norms where there are, rotary, the K/V rows written into the
 * cache, row-wise attention, the output projection and residual, RMSNorm, the fused gate/up matmul,
 * SiLU(gate) * up, the down projection and residual, and the wanted taps of the residual stream.
 *
 * The drafters' layers are the same layers on bf16 weights (WEIGHT_BF16: pack_bf16's layout, on
 * AMX or AVX512-BF16), where the torch ops cost more than the matmuls: a draft block of 7-8 rows
 * through 2-3 layers is ~2 ms of arithmetic, and was ~5 ms.  What only drafters ask for:
 *  - `see_block`: each query row sees every row of its block (DFlash's bidirectional block), not
 *    only the rows up to its own;
 *  - `ctx_rows`: leading rows that are context, not queries (DFlash's projected verifier feature
 *    of newly committed positions): every layer writes their keys and values, straight from the
 *    rows (no input norm), through the same q/k/v matmul as the block's rows; with `context`
 *    the call makes those rows itself from the verifier's taps (norm(fc(taps)));
 *  - `hidden_norm` on the first layer (the EAGLE family): q/k/v read [norm(embedding); norm'(f)]
 *    of the row's embedding in `h` and its feature f in `feature`, and the residual stream starts
 *    from f (normed where `residual_normed`);
 *  - the final norm, the head and the greedy pick (`head`): on this CPU each torch op around the
 *    call costs 10-50 us, so a draft's few of them (the context's fc and norm, the argmax) were a
 *    fifth of a DFlash draft.
 *
 * Its numbers are its own (the norms' sums of squares 16 lanes at a time, SiLU through
 * exp_nonpositive), within float32 rounding of the torch ops, and batch-invariant for the same
 * reason as the kernels it calls: every step is a row's own, in a fixed order whatever the row
 * count.  `batch_invariant.check` proves that on the loaded verifier at load.
 */
#include "kernels.h"

typedef struct {
    const float *ln1, *ln2;       /* the two RMSNorms' weights [hidden] */
    const float *q_norm, *k_norm; /* Qwen3's per-head norms' weights [d], or NULL */
    const float *hidden_norm;     /* the EAGLE family's first layer: the feature's norm, or NULL */
    float eps1, eps2, q_eps, k_eps, scaling, hidden_eps;
    int32_t residual_normed, unused;
    specui_layer_weight qkv, o, gate_up, down; /* q/k/v and gate/up fused (outputs in that order) */
} specui_layer;

/* The final norm and LM head after the layers (a drafter's): every query row normed into `normed`
 * [queries][hidden], the rows from `logits_from` on multiplied by `w` into `logits`, and each
 * logits row's first maximum (torch's argmax), mapped to the target vocabulary through `d2t`
 * where there is one, into `tokens` (where not NULL): a greedy draft's pick in the call. */
typedef struct {
    const float *norm;
    float eps;
    int32_t logits_from;
    specui_layer_weight w;
    float *normed, *logits;
    const int64_t *d2t;
    int64_t *tokens;
    /* 1: the query rows before logits_from are only keys and values in the last layer (the EAGLE
     * family's rows of committed positions: read later as cache, never as output), and their
     * stream after it and their normed rows are not computed. */
    int64_t kv_only_before;
} specui_layers_head;

/* The context rows made in the call from the verifier's taps (DFlash's C = norm(fc(taps))): row r
 * of the `ctx_rows` is rms_norm(w features[r]) before the first layer reads it. */
typedef struct {
    specui_layer_weight w;
    const float *norm;
    float eps;
    int32_t unused;
    const float *features; /* [ctx_rows][w.k] */
} specui_context_in;

/* torch.argmax's pick on a row of n floats: the first maximum, or the first NaN where there is
 * one (torch ranks NaN above every number). */
int64_t first_max(const float *row, int64_t n) {
    __m512 best = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = first_lanes(n - j);
        const __m512 v = _mm512_mask_loadu_ps(best, m, row + j);
        const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        if (nan) return j + __builtin_ctz(nan);
        best = _mm512_max_ps(best, v);
    }
    const float top = _mm512_reduce_max_ps(best);
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = first_lanes(n - j);
        const __mmask16 eq = _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, row + j), _mm512_set1_ps(top), _CMP_EQ_OQ);
        if (eq) return j + __builtin_ctz(eq);
    }
    return 0; /* every entry -inf */
}

/* out = weight * (x * rsqrt(mean(x^2) + eps)) over n floats (n a multiple of 16). */
static void rms_norm(const float *x, const float *weight, float eps, int64_t n, float *out) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    const __m512 r = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)n + eps));
    for (int64_t i = 0; i < n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(weight + i), _mm512_mul_ps(_mm512_loadu_ps(x + i), r)));
}

/* out[i] = x[i] cos[i] + x[(i + d/2) % d] ssin[i]: rotate_half's rotary, its signs in ssin. */
static void rotate(const float *x, const float *cos, const float *ssin, int64_t d, float *out) {
    const int64_t half = d / 2;
    for (int64_t i = 0; i < d; ++i) out[i] = x[i] * cos[i] + x[(i + half) % d] * ssin[i];
}

/* gate_up: [2 n] (gate, then up) -> out [n] = silu(gate) * up; silu(g) = g / (1 + e^-g), with
 * e^-|g| only (no overflow): sigmoid(g) = 1 / (1 + e) for g >= 0, e / (1 + e) below. */
static void silu_mul(const float *gate_up, int64_t n, float *out) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __m512 g = _mm512_loadu_ps(gate_up + i), u = _mm512_loadu_ps(gate_up + n + i);
        const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
        const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
        const __m512 num = _mm512_mask_mov_ps(one, neg, e);
        const __m512 sig = _mm512_div_ps(num, _mm512_add_ps(one, e));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(g, sig), u));
    }
}

/* float32 rows -> bf16 rounded to nearest even (what torch's .to(torch.bfloat16) gives), each
 * row padded with zeros to kp; then the bf16 kernel. */
static int bf16_rows_matmul(const specui_layer_weight *w, const float *x, int64_t rows, float *out) {
    const int64_t k = w->k, kp = (k + 31) / 32 * 32;
    uint16_t *xb = calloc((size_t)(rows * kp), sizeof(uint16_t));
    if (!xb) return -1;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < k; i += 16) {
            const __mmask16 m = first_lanes(k - i);
            const __m256bh b = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + r * k + i));
            _mm256_mask_storeu_epi16(xb + r * kp + i, m, (__m256i)b);
        }
    const uint16_t *wp = (const uint16_t *)w->data;
    int rc = w->amx ? specui_bf16_matmul(xb, rows, kp, kp, wp, w->bias, w->n_out, out)
                    : specui_bf16_matmul_avx512(xb, rows, kp, kp, wp, w->bias, w->n_out, out);
    free(xb);
    return rc;
}

int weight_matmul(const specui_layer_weight *w, const float *x, int64_t rows, float *out) {
    if (w->type == WEIGHT_BF16) return bf16_rows_matmul(w, x, rows, out);
    int rc = specui_gguf_matmul(w->type, x, rows, w->k, w->data, w->n_out, out);
    if (rc == 0 && w->bias)
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < w->n_out; ++j) out[r * w->n_out + j] += w->bias[j];
    return rc;
}

/* h: [rows][hidden] float32: `ctx_rows` context rows, then the query rows, whose residual stream
 * is updated in place; cos, ssin: [rows][d], each row's rotary; feature: [rows - ctx_rows][hidden]
 * when the first layer has a hidden_norm, else unused; kv: the cache
 * [layers][2][kv_heads][capacity][d], row r's keys and values written at start + r, positions below
 * `start` already filled; query row i sees cache positions up to start + ctx_rows + i, or every
 * row of the call with `see_block`; taps: [slots][query rows][hidden], tap_slot[l] (l = 1..layers)
 * the slot of the stream after layer l, or -1; head: the final norm and LM head, or NULL; context:
 * the context rows' projection (their rows in h are then written, not read), or NULL.  hidden and
 * the intermediate size multiples of 32, d of 16.  Returns 0, -1 without memory, -2 on shapes the
 * kernels do not take. */
int specui_decoder_layers(const specui_layer *layers, int64_t n_layers, int64_t heads, int64_t kv_heads,
                          int64_t d, float *h, int64_t rows, int64_t hidden, const float *cos, const float *ssin,
                          float *kv, int64_t capacity, int64_t start, const int64_t *tap_slot, float *taps,
                          int64_t ctx_rows, int64_t see_block, const float *feature,
                          const specui_layers_head *head, const specui_context_in *context) {
    const int64_t nq = rows - ctx_rows;
    if (nq <= 0 || ctx_rows < 0 || hidden % 32 || d % 16 || kv_heads <= 0 || heads % kv_heads ||
        start < 0 || start + rows > capacity)
        return -2;
    if (head && (head->w.k != hidden || head->logits_from < 0 || head->logits_from >= nq)) return -2;
    if (context && (context->w.n_out != hidden || !context->features)) return -2;
    const int64_t qd = heads * d, kd = kv_heads * d, qkv_out = qd + 2 * kd;
    const int64_t inter = layers[0].gate_up.n_out / 2;
    if (inter % 32) return -2;
    for (int64_t i = 0; i < n_layers; ++i) {
        const specui_layer *L = layers + i;
        const int64_t in = L->hidden_norm ? 2 * hidden : hidden;
        if (L->hidden_norm && (i > 0 || ctx_rows > 0 || !feature)) return -2;
        if (L->qkv.n_out != qkv_out || L->qkv.k != in || L->o.k != qd || L->o.n_out != hidden ||
            L->gate_up.n_out != 2 * inter || L->gate_up.k != hidden || L->down.k != inter || L->down.n_out != hidden)
            return -2;
    }
    float *x = malloc(sizeof(float) * rows * 2 * hidden), *t = malloc(sizeof(float) * nq * hidden);
    float *qkv = malloc(sizeof(float) * rows * qkv_out), *q = malloc(sizeof(float) * nq * qd);
    float *att = malloc(sizeof(float) * nq * qd), *gu = malloc(sizeof(float) * nq * 2 * inter);
    float *g = malloc(sizeof(float) * nq * inter), *tmp = malloc(sizeof(float) * d);
    int rc = (x && t && qkv && q && att && gu && g && tmp) ? 0 : -1;
    const int64_t head_stride = capacity * d;
    float *hq = h + ctx_rows * hidden; /* the query rows' residual stream */
    if (rc == 0 && context && ctx_rows > 0) { /* x holds rows x 2 hidden floats: room for these */
        rc = weight_matmul(&context->w, context->features, ctx_rows, x);
        for (int64_t r = 0; r < ctx_rows && rc == 0; ++r)
            rms_norm(x + r * hidden, context->norm, context->eps, hidden, h + r * hidden);
    }
    for (int64_t i = 0; i < n_layers && rc == 0; ++i) {
        const specui_layer *L = layers + i;
        float *keys = kv + (i * 2) * kv_heads * head_stride, *values = keys + kv_heads * head_stride;
        const int64_t in = L->qkv.k;
        for (int64_t r = 0; r < ctx_rows; ++r) memcpy(x + r * in, h + r * hidden, sizeof(float) * hidden);
        for (int64_t r = 0; r < nq; ++r) {
            float *xr = x + (ctx_rows + r) * in, *hr = hq + r * hidden;
            rms_norm(hr, L->ln1, L->eps1, hidden, xr);
            if (L->hidden_norm) { /* [norm(embedding); norm'(feature)]; the stream starts from f */
                const float *f = feature + r * hidden;
                rms_norm(f, L->hidden_norm, L->hidden_eps, hidden, xr + hidden);
                memcpy(hr, L->residual_normed ? xr + hidden : f, sizeof(float) * hidden);
            }
        }
        if ((rc = weight_matmul(&L->qkv, x, rows, qkv))) break;
        for (int64_t r = 0; r < rows; ++r) {
            const float *row = qkv + r * qkv_out, *c = cos + r * d, *s = ssin + r * d;
            for (int64_t hd = 0; hd < heads && r >= ctx_rows; ++hd) {
                const float *src = row + hd * d;
                if (L->q_norm) rms_norm(src, L->q_norm, L->q_eps, d, tmp), src = tmp;
                rotate(src, c, s, d, q + ((r - ctx_rows) * heads + hd) * d);
            }
            for (int64_t gh = 0; gh < kv_heads; ++gh) {
                const float *src = row + qd + gh * d;
                if (L->k_norm) rms_norm(src, L->k_norm, L->k_eps, d, tmp), src = tmp;
                rotate(src, c, s, d, keys + gh * head_stride + (start + r) * d);
                memcpy(values + gh * head_stride + (start + r) * d, row + qd + kd + gh * d, sizeof(float) * d);
            }
        }
        /* the rows that go on through this layer: all, or in the last one from logits_from where
         * the rows before it are only keys and values */
        const int64_t skip = (i == n_layers - 1 && head && head->kv_only_before) ? head->logits_from : 0;
        const int64_t nr = nq - skip;
        float *hs = hq + skip * hidden;
        if ((rc = attention_rows(q + skip * heads * d, nr, heads, d, keys, values, kv_heads, head_stride,
                                 start + ctx_rows + skip, L->scaling, see_block, att)))
            break;
        if ((rc = weight_matmul(&L->o, att, nr, t))) break;
        for (int64_t j = 0; j < nr * hidden; ++j) hs[j] += t[j];
        for (int64_t r = 0; r < nr; ++r) rms_norm(hs + r * hidden, L->ln2, L->eps2, hidden, x + r * hidden);
        if ((rc = weight_matmul(&L->gate_up, x, nr, gu))) break;
        for (int64_t r = 0; r < nr; ++r) silu_mul(gu + r * 2 * inter, inter, g + r * inter);
        if ((rc = weight_matmul(&L->down, g, nr, t))) break;
        for (int64_t j = 0; j < nr * hidden; ++j) hs[j] += t[j];
        if (tap_slot[i + 1] >= 0) memcpy(taps + tap_slot[i + 1] * nq * hidden, hq, sizeof(float) * nq * hidden);
    }
    if (rc == 0 && head) {
        for (int64_t r = head->kv_only_before ? head->logits_from : 0; r < nq; ++r)
            rms_norm(hq + r * hidden, head->norm, head->eps, hidden, head->normed + r * hidden);
        const int64_t n_logits = nq - head->logits_from, vocab = head->w.n_out;
        rc = weight_matmul(&head->w, head->normed + head->logits_from * hidden, n_logits, head->logits);
        for (int64_t r = 0; rc == 0 && head->tokens && r < n_logits; ++r) {
            const int64_t best = first_max(head->logits + r * vocab, vocab);
            head->tokens[r] = head->d2t ? best + head->d2t[best] : best;
        }
    }
    free(x); free(t); free(qkv); free(q); free(att); free(gu); free(g); free(tmp);
    return rc;
}
