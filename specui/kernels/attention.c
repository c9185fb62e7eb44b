/* ---- Causal attention, one query row at a time, in a fixed order ------------------------------
 *
 *   out[r][h] = sum_j softmax_j(q[r][h] . k[j] * scale) v[j],   j = 0 .. start + r
 *
 * Each (row, head) is computed on its own, by the same instructions in the same order,
 * whatever the other rows of the call: the scores sixteen keys at a time (`key_scores`), their
 * maximum, exp(s - max) summed 16 lanes at a time from key 0, then the values summed in key
 * order.  So a token's
 * attention in a verify block is bit for bit the one it gets decoded alone (the property
 * specui.verifier.batch_invariant needs), without one SDPA call per row (~60 us each, most of
 * a verify block's extra cost).  Grouped-query attention: head h reads kv head h / (heads / kv_heads).
 */

#include "kernels.h"

#define MAX_HEAD_CHUNKS 16 /* head_dim up to 256 */

/* The 16 lane sums of acc[0..15] as one vector (lane i: acc[i]'s sum), by a transposing tree of
 * 15 shuffles and 15 adds instead of 16 horizontal reductions (~4 times the work each).  Lane i's
 * sum only ever adds acc[i]'s own lanes, in an order fixed by i alone. */
static inline __m512 sum16(const __m512 *acc) {
    __m512 v[8], w[4];
    for (int i = 0; i < 8; ++i) /* per 128 bits: a0+a2, b0+b2, a1+a3, b1+b3 */
        v[i] = _mm512_add_ps(_mm512_unpacklo_ps(acc[2 * i], acc[2 * i + 1]),
                             _mm512_unpackhi_ps(acc[2 * i], acc[2 * i + 1]));
    for (int i = 0; i < 4; ++i) /* per 128 bits: acc[4i..4i+3]'s sums over those 4 lanes */
        w[i] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0xEE));
    const __m512 p0 = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
    const __m512 p1 = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x88), _mm512_shuffle_f32x4(w[2], w[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(p0, p1, 0x88), _mm512_shuffle_f32x4(p0, p1, 0xDD));
}

/* scores[j] = (q . k[j]) scale for n keys from an index that is a multiple of 16, sixteen at a time.
 * A key's score is the same bits whatever n: past n a group's lanes are zeros, never read. */
static inline void key_scores(const __m512 *qv, int64_t chunks, const float *kg, int64_t d, int64_t n,
                              float scale, float *scores) {
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        const int64_t m16 = n - j0 < 16 ? n - j0 : 16;
        __m512 acc[16];
        for (int64_t i = 0; i < 16; ++i) {
            if (i >= m16) {
                acc[i] = _mm512_setzero_ps();
                continue;
            }
            const float *kj = kg + (j0 + i) * d;
            __m512 a = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kj));
            for (int64_t c = 1; c < chunks; ++c) a = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kj + c * 16), a);
            acc[i] = a;
        }
        const __m512 s = _mm512_mul_ps(sum16(acc), _mm512_set1_ps(scale));
        _mm512_mask_storeu_ps(scores + j0, first_lanes(m16), s);
    }
}

/* Two queries' scores over the same n keys (n <= 64, from an index that is a multiple of 8), eight
 * keys at a time: lanes 0-7 the first query's, 8-15 the second's, so each key row is loaded once
 * for both.  The bits are key_scores': a score is the same multiply-adds of the same chunks, and
 * sum16 sums each vector in an order that does not depend on its position (a vector's lanes go
 * through the same shuffles wherever it sits; checked on 200,000 random trials). */
static inline void key_scores_pair(const __m512 *qa, const __m512 *qb, const float *kg, int64_t n,
                                   float scale, float *sa, float *sb) {
    for (int64_t j0 = 0; j0 < n; j0 += 8) {
        const int64_t m8 = n - j0 < 8 ? n - j0 : 8;
        __m512 acc[16];
        for (int64_t i = 0; i < 8; ++i) {
            if (i >= m8) {
                acc[i] = acc[8 + i] = _mm512_setzero_ps();
                continue;
            }
            const float *kj = kg + (j0 + i) * 64;
            const __m512 k0 = _mm512_loadu_ps(kj), k1 = _mm512_loadu_ps(kj + 16);
            const __m512 k2 = _mm512_loadu_ps(kj + 32), k3 = _mm512_loadu_ps(kj + 48);
            acc[i] = _mm512_fmadd_ps(qa[3], k3, _mm512_fmadd_ps(qa[2], k2, _mm512_fmadd_ps(qa[1], k1, _mm512_mul_ps(qa[0], k0))));
            acc[8 + i] = _mm512_fmadd_ps(qb[3], k3, _mm512_fmadd_ps(qb[2], k2, _mm512_fmadd_ps(qb[1], k1, _mm512_mul_ps(qb[0], k0))));
        }
        const __m512 s = _mm512_mul_ps(sum16(acc), _mm512_set1_ps(scale));
        const __mmask16 m = first_lanes(m8);
        _mm512_mask_storeu_ps(sa + j0, m, s);
        _mm512_mask_storeu_ps(sb + j0, m, _mm512_shuffle_f32x4(s, s, 0xEE));
    }
}

/* Keys a block at a time: every query of a kv head's group (all rows, `group` heads) meets a
 * block of its keys, then of its values, while the block is in L1, where one query at a time over
 * all its keys read the kv head's whole cache from L2 per query (27 times in a 9-row verify).
 * With the scores' transposing sums (`sum16`), 17% less time at 500 keys. */
#define KEY_BLOCK 64

/* The values step for d = 64 (most small models): up to PV_TILE queries of a kv head meet each
 * value row of a block together, loaded once for all of them, where one query at a time loaded it
 * once per query.  Each query's sums still get the keys one by one in key order, by the same
 * multiply-adds: the same bits as the general loop below. */
#define PV_TILE 4

static inline __attribute__((always_inline)) void pv_tile(const float *const *sc, float *const *oh,
                                                          const int64_t *end, const float *vg,
                                                          int64_t j0, const int T) {
    __m512 o[PV_TILE][4];
    int64_t common = end[0];
    for (int t = 0; t < T; ++t) {
        for (int c = 0; c < 4; ++c) o[t][c] = _mm512_loadu_ps(oh[t] + c * 16);
        if (end[t] < common) common = end[t];
    }
    for (int64_t j = j0; j < common; ++j) {
        const float *vj = vg + j * 64;
        const __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16);
        const __m512 v2 = _mm512_loadu_ps(vj + 32), v3 = _mm512_loadu_ps(vj + 48);
        for (int t = 0; t < T; ++t) {
            const __m512 p = _mm512_set1_ps(sc[t][j]);
            o[t][0] = _mm512_fmadd_ps(p, v0, o[t][0]);
            o[t][1] = _mm512_fmadd_ps(p, v1, o[t][1]);
            o[t][2] = _mm512_fmadd_ps(p, v2, o[t][2]);
            o[t][3] = _mm512_fmadd_ps(p, v3, o[t][3]);
        }
    }
    for (int t = 0; t < T; ++t) {
        for (int64_t j = common; j < end[t]; ++j) { /* the causal tail of the longer queries */
            const __m512 p = _mm512_set1_ps(sc[t][j]);
            for (int c = 0; c < 4; ++c) o[t][c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vg + j * 64 + c * 16), o[t][c]);
        }
        for (int c = 0; c < 4; ++c) _mm512_storeu_ps(oh[t] + c * 16, o[t][c]);
    }
}

static void values_d64(const float *scores, int64_t stride, int64_t rows, int64_t heads, int64_t kv_heads,
                       int64_t head_stride, const float *v, int64_t start, int64_t seen, int64_t longest,
                       float *out) {
    const int64_t group = heads / kv_heads;
    for (int64_t g = 0; g < kv_heads; ++g)
        for (int64_t j0 = 0; j0 < longest; j0 += KEY_BLOCK) {
            const float *sc[PV_TILE];
            float *oh[PV_TILE];
            int64_t end[PV_TILE];
            int T = 0;
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t len = seen > 0 ? seen : start + r + 1;
                if (j0 >= len) continue;
                for (int64_t h = g * group; h < (g + 1) * group; ++h) {
                    sc[T] = scores + (r * heads + h) * stride;
                    oh[T] = out + (r * heads + h) * 64;
                    end[T] = len - j0 < KEY_BLOCK ? len : j0 + KEY_BLOCK;
                    if (++T == PV_TILE) {
                        pv_tile(sc, oh, end, v + g * head_stride, j0, PV_TILE);
                        T = 0;
                    }
                }
            }
            switch (T) { /* a constant T each, so the sums stay in registers */
            case 1: pv_tile(sc, oh, end, v + g * head_stride, j0, 1); break;
            case 2: pv_tile(sc, oh, end, v + g * head_stride, j0, 2); break;
            case 3: pv_tile(sc, oh, end, v + g * head_stride, j0, 3); break;
            default: break;
            }
        }
}

/* The scores step for d = 64: the queries of a kv head's group that see a block, two at a time
 * (key_scores_pair) over the keys both see, the longer one's rest on its own (key_scores). */
static void scores_d64(const float *q, int64_t rows, int64_t heads, const float *k, int64_t kv_heads,
                       int64_t head_stride, int64_t start, float scale, int64_t seen, int64_t longest,
                       int64_t stride, float *scores) {
    const int64_t group = heads / kv_heads;
    for (int64_t g = 0; g < kv_heads; ++g)
        for (int64_t j0 = 0; j0 < longest; j0 += KEY_BLOCK) {
            const float *kb = k + g * head_stride + j0 * 64;
            int64_t pending = -1, pending_n = 0; /* a query waiting for a partner: (r * heads + h) */
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t len = seen > 0 ? seen : start + r + 1;
                if (j0 >= len) continue;
                const int64_t n = len - j0 < KEY_BLOCK ? len - j0 : KEY_BLOCK;
                for (int64_t h = g * group; h < (g + 1) * group; ++h) {
                    const int64_t i = r * heads + h;
                    if (pending < 0) {
                        pending = i, pending_n = n;
                        continue;
                    }
                    __m512 qa[4], qb[4];
                    for (int c = 0; c < 4; ++c) {
                        qa[c] = _mm512_loadu_ps(q + pending * 64 + c * 16);
                        qb[c] = _mm512_loadu_ps(q + i * 64 + c * 16);
                    }
                    /* rows come in order, so the later query sees at least the earlier one's keys */
                    const int64_t both = pending_n < n ? pending_n : n;
                    const int64_t both16 = both / 16 * 16; /* the single path's groups of 16 stay whole */
                    key_scores_pair(qa, qb, kb, both16, scale, scores + pending * stride + j0,
                                    scores + i * stride + j0);
                    key_scores(qa, 4, kb + both16 * 64, 64, pending_n - both16, scale, scores + pending * stride + j0 + both16);
                    key_scores(qb, 4, kb + both16 * 64, 64, n - both16, scale, scores + i * stride + j0 + both16);
                    pending = -1;
                }
            }
            if (pending >= 0) {
                __m512 qa[4];
                for (int c = 0; c < 4; ++c) qa[c] = _mm512_loadu_ps(q + pending * 64 + c * 16);
                key_scores(qa, 4, kb, 64, pending_n, scale, scores + pending * stride + j0);
            }
        }
}

/* Up to ATTENTION_ROWS rows of attention_rows: row r sees keys 0 .. start + r, or the first `seen`
 * where seen > 0. */
static int attention_part(const float *q, int64_t rows, int64_t heads, int64_t d, const float *k,
                          const float *v, int64_t kv_heads, int64_t head_stride, int64_t start,
                          float scale, int64_t seen, float *out) {
    const int64_t chunks = d / 16, group = heads / kv_heads, longest = seen > 0 ? seen : start + rows;
    const int64_t stride = (longest + 15) / 16 * 16; /* a query's scores */
    float *scores = malloc(sizeof(float) * rows * heads * stride), *inv = malloc(sizeof(float) * rows * heads);
    if (!scores || !inv) {
        free(scores);
        free(inv);
        return -1;
    }
    /* 1. the scores, a block of a kv head's keys at a time */
    if (d == 64) {
        scores_d64(q, rows, heads, k, kv_heads, head_stride, start, scale, seen, longest, stride, scores);
    } else {
    for (int64_t g = 0; g < kv_heads; ++g)
        for (int64_t j0 = 0; j0 < longest; j0 += KEY_BLOCK)
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t len = seen > 0 ? seen : start + r + 1; /* keys row r sees */
                if (j0 >= len) continue;
                const int64_t n = len - j0 < KEY_BLOCK ? len - j0 : KEY_BLOCK;
                for (int64_t h = g * group; h < (g + 1) * group; ++h) {
                    __m512 qv[MAX_HEAD_CHUNKS];
                    for (int64_t c = 0; c < chunks; ++c) qv[c] = _mm512_loadu_ps(q + (r * heads + h) * d + c * 16);
                    key_scores(qv, chunks, k + g * head_stride + j0 * d, d, n, scale,
                               scores + (r * heads + h) * stride + j0);
                }
            }
    }
    /* 2. per query: its maximum, exp(s - max) in place, their sum 16 lanes at a time from key 0 */
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t len = seen > 0 ? seen : start + r + 1;
        for (int64_t h = 0; h < heads; ++h) {
            float *sc = scores + (r * heads + h) * stride;
            __m512 top = _mm512_set1_ps(-INFINITY), total = _mm512_setzero_ps();
            for (int64_t j = 0; j < len; j += 16) {
                const __mmask16 m = first_lanes(len - j);
                top = _mm512_mask_max_ps(top, m, top, _mm512_maskz_loadu_ps(m, sc + j));
            }
            const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(top));
            for (int64_t j = 0; j < len; j += 16) {
                const __mmask16 m = first_lanes(len - j);
                const __m512 s = _mm512_maskz_loadu_ps(m, sc + j);
                const __m512 p = _mm512_maskz_mov_ps(m, exp_nonpositive(_mm512_sub_ps(s, mx)));
                _mm512_mask_storeu_ps(sc + j, m, p);
                total = _mm512_add_ps(total, p);
            }
            inv[r * heads + h] = 1.0f / _mm512_reduce_add_ps(total);
            memset(out + (r * heads + h) * d, 0, sizeof(float) * d);
        }
    }
    /* 3. the values, a block at a time, each query's sums carried in `out` in key order */
    if (d == 64) {
        values_d64(scores, stride, rows, heads, kv_heads, head_stride, v, start, seen, longest, out);
    } else {
    for (int64_t g = 0; g < kv_heads; ++g)
        for (int64_t j0 = 0; j0 < longest; j0 += KEY_BLOCK)
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t len = seen > 0 ? seen : start + r + 1;
                if (j0 >= len) continue;
                const int64_t end = len - j0 < KEY_BLOCK ? len : j0 + KEY_BLOCK;
                for (int64_t h = g * group; h < (g + 1) * group; ++h) {
                    const float *sc = scores + (r * heads + h) * stride;
                    float *oh = out + (r * heads + h) * d;
                    __m512 o[MAX_HEAD_CHUNKS];
                    for (int64_t c = 0; c < chunks; ++c) o[c] = _mm512_loadu_ps(oh + c * 16);
                    for (int64_t j = j0; j < end; ++j) {
                        const __m512 p = _mm512_set1_ps(sc[j]);
                        const float *vj = v + g * head_stride + j * d;
                        for (int64_t c = 0; c < chunks; ++c) o[c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vj + c * 16), o[c]);
                    }
                    for (int64_t c = 0; c < chunks; ++c) _mm512_storeu_ps(oh + c * 16, o[c]);
                }
            }
    }
    for (int64_t i = 0; i < rows * heads; ++i) {
        const __m512 scale_by = _mm512_set1_ps(inv[i]);
        for (int64_t c = 0; c < chunks; ++c)
            _mm512_storeu_ps(out + i * d + c * 16, _mm512_mul_ps(_mm512_loadu_ps(out + i * d + c * 16), scale_by));
    }
    free(scores);
    free(inv);
    return 0;
}

/* Rows a part at a time, so the scores' scratch stays rows x heads x keys for a few rows (a
 * drafter's pass over a long prompt has thousands of query rows); a row's bits do not depend on
 * its part. */
#define ATTENTION_ROWS 16

/* q: [rows][heads][d]; k, v: kv_heads x (start + rows) keys, at k + g * head_stride + j * d;
 * row r sees keys 0 .. start + r, or all start + rows of them with see_block (a drafter's
 * bidirectional block: the same sums over more keys).  out: [rows][heads][d].  d a multiple of
 * 16.  Returns 0, -1 without memory, -2 on bad shapes. */
int attention_rows(const float *q, int64_t rows, int64_t heads, int64_t d, const float *k,
                   const float *v, int64_t kv_heads, int64_t head_stride, int64_t start,
                   float scale, int64_t see_block, float *out) {
    if (d % 16 || d / 16 > MAX_HEAD_CHUNKS || kv_heads <= 0 || heads % kv_heads) return -2;
    for (int64_t r0 = 0; r0 < rows; r0 += ATTENTION_ROWS) {
        const int64_t n = rows - r0 < ATTENTION_ROWS ? rows - r0 : ATTENTION_ROWS;
        const int rc = attention_part(q + r0 * heads * d, n, heads, d, k, v, kv_heads, head_stride, start + r0,
                                      scale, see_block ? start + rows : 0, out + r0 * heads * d);
        if (rc) return rc;
    }
    return 0;
}

int specui_attention_rows(const float *q, int64_t rows, int64_t heads, int64_t d, const float *k,
                          const float *v, int64_t kv_heads, int64_t head_stride, int64_t start,
                          float scale, float *out) {
    return attention_rows(q, rows, heads, d, k, v, kv_heads, head_stride, start, scale, 0, out);
}
