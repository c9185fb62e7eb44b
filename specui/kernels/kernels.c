/* SpecUI's CPU kernels (specui/verifier/cpu_kernels.py builds and loads this file).
 * First: the int8 verifier's matmul for a few rows.
 *
 *   out[r][o] = (float)(sum_k (x[r][k] - 128) * w[o][k]) * wscale[o]
 *
 * x: rows of uint8 activations with zero point 128 (specui.verifier.batch_invariant.quantize_rows);
 * w: int8 weights with one float32 scale per output channel.  This is what oneDNN's u8s8
 * qlinear_pointwise returns for the same operands, bit for bit: the sum is an exact int32
 * in any order, and it becomes float once, times the channel's scale.
 *
 * Why a kernel of our own: a decode step multiplies one to a dozen rows by every weight of
 * the model, so it is a stream through the weights.  Here each 64-byte load of weights (16
 * output channels x 4 inputs, the layout `pack` in cpu_kernels.py writes) meets every row of
 * the block in registers (AVX512-VNNI vpdpbusd), with no horizontal sums: one pass over the
 * weights for up to MAX_ROWS rows, at the memory's speed.
 *
 * vpdpbusd multiplies unsigned by signed bytes.  The weights are stored unsigned (w + 128)
 * and the activations made signed (x - 128), so the sum it returns is the wanted one plus
 * 128 * sum(x - 128), which is taken off exactly.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <float.h>
#include <math.h>
#include <string.h>

#define TILE 16     /* output channels per accumulator (16 int32 lanes) */

/* The first n of 16 lanes (all 16 where n >= 16): a row's tail, or a tile's last channels. */
static inline __attribute__((always_inline)) __mmask16 first_lanes(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}

#define MAX_ROWS 12 /* rows per pass: 2 tiles x 12 rows = 24 accumulators of the 32 registers */

/* R rows (x_signed, kp bytes each, with their sums) times G tiles of channels from `o`. */
static inline __attribute__((always_inline)) void pass(const int8_t *xs, const int32_t *xsum,
                                                       int64_t kp, const uint8_t *wp,
                                                       const float *wscale, float *out,
                                                       int64_t n_out, int64_t o, int R, int G) {
    __m512i acc[MAX_ROWS][2];
    for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_si512();
    const uint8_t *t0 = wp + (o / TILE) * kp * TILE, *t1 = t0 + kp * TILE;
    for (int64_t q = 0; q < kp / 4; ++q) {
        __m512i w0 = _mm512_loadu_si512(t0 + q * 64);
        __m512i w1 = G > 1 ? _mm512_loadu_si512(t1 + q * 64) : w0;
        for (int i = 0; i < R; ++i) {
            int32_t four;
            memcpy(&four, xs + i * kp + q * 4, 4);
            __m512i xb = _mm512_set1_epi32(four);
            acc[i][0] = _mm512_dpbusd_epi32(acc[i][0], w0, xb);
            if (G > 1) acc[i][1] = _mm512_dpbusd_epi32(acc[i][1], w1, xb);
        }
    }
    for (int g = 0; g < G; ++g) {
        int64_t oc = o + g * TILE, left = n_out - oc;
        __mmask16 m = first_lanes(left);
        __m512 scale = _mm512_maskz_loadu_ps(m, wscale + oc);
        for (int i = 0; i < R; ++i) {
            __m512i exact = _mm512_sub_epi32(acc[i][g], _mm512_set1_epi32(128 * xsum[i]));
            _mm512_mask_storeu_ps(out + i * n_out + oc, m,
                                  _mm512_mul_ps(_mm512_cvtepi32_ps(exact), scale));
        }
    }
}

/* R and G as constants, so each pass keeps its accumulators in registers. */
#define PASS(r, g) case r: pass(xs, xsum, kp, wp, wscale, out, n_out, o, r, g); return;
#define ALL_ROWS(g) PASS(1, g) PASS(2, g) PASS(3, g) PASS(4, g) PASS(5, g) PASS(6, g) \
                    PASS(7, g) PASS(8, g) PASS(9, g) PASS(10, g) PASS(11, g) PASS(12, g)
static void dispatch(const int8_t *xs, const int32_t *xsum, int64_t kp, const uint8_t *wp,
                     const float *wscale, float *out, int64_t n_out, int64_t o, int R, int G) {
    if (G == 2) {
        switch (R) { ALL_ROWS(2) }
    } else {
        switch (R) { ALL_ROWS(1) }
    }
}

/* x: [rows, k] uint8; wp: packed weights of n_out channels, k padded to kp (a multiple of 4);
 * out: [rows, n_out] float32.  Returns 0, or -1 when it cannot allocate its scratch. */
int specui_int8_matmul(const uint8_t *x, int64_t rows, int64_t k, int64_t kp,
                       const uint8_t *wp, const float *wscale, int64_t n_out, float *out) {
    int8_t stack[MAX_ROWS * 2048];
    int8_t *xs = MAX_ROWS * kp <= (int64_t)sizeof(stack) ? stack : malloc(MAX_ROWS * kp);
    int32_t xsum[MAX_ROWS];
    if (!xs) return -1;
    for (int64_t r0 = 0; r0 < rows; r0 += MAX_ROWS) {
        int R = rows - r0 < MAX_ROWS ? (int)(rows - r0) : MAX_ROWS;
        for (int i = 0; i < R; ++i) { /* signed activations, zero-padded to kp, and their sum */
            const uint8_t *src = x + (r0 + i) * k;
            int8_t *dst = xs + i * kp;
            int32_t s = 0;
            for (int64_t j = 0; j < k; ++j) s += dst[j] = (int8_t)(src[j] ^ 0x80);
            for (int64_t j = k; j < kp; ++j) dst[j] = 0;
            xsum[i] = s;
        }
        float *rows_out = out + r0 * n_out;
        int64_t o = 0;
        for (; o + 2 * TILE <= n_out; o += 2 * TILE) dispatch(xs, xsum, kp, wp, wscale, rows_out, n_out, o, R, 2);
        for (; o < n_out; o += TILE) dispatch(xs, xsum, kp, wp, wscale, rows_out, n_out, o, R, 1);
    }
    if (xs != stack) free(xs);
    return 0;
}

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

/* e^x for x <= 0 (Cephes' single-precision polynomial after x = n ln2 + r), 16 lanes. */
static inline __m512 exp_nonpositive(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    return _mm512_scalef_ps(_mm512_add_ps(p, _mm512_set1_ps(1.0f)), n);
}

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

/* Keys a block at a time: every query of a kv head's group (all rows, `group` heads) meets a
 * block of its keys, then of its values, while the block is in L1, where one query at a time over
 * all its keys read the kv head's whole cache from L2 per query (27 times in a 9-row verify).
 * With the scores' transposing sums (`sum16`), 17% less time at 500 keys. */
#define KEY_BLOCK 64

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
static int attention_rows(const float *q, int64_t rows, int64_t heads, int64_t d, const float *k,
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

/* ---- The bf16 matmul for a few rows, on AMX ---------------------------------------------------
 *
 *   out[r][o] = sum_k x[r][k] * w[o][k] (+ bias[o]),  bf16 operands, float32 sums
 *
 * Intel AMX multiplies a 16-row tile of activations by a 32 x 16 tile of weights per
 * instruction, so up to 16 rows cost what one row costs: the weights stream through once, and
 * a verify block is nearly free next to a one-token step (AVX512-BF16 dot products made a
 * 9-row block cost 2.2x a row here).  Longer blocks (prefills) pass 16 rows at a time over
 * each column of 16 channels while it is in cache, so this serves every row count.  Every call configures the tiles the same way (16 rows,
 * the rows past the block zero), and a tile row's sums do not depend on the other rows, so a
 * row's result is the same at any row count.  These are not oneDNN's bits (another order).
 * The weights use the layout `pack_bf16` writes, [channels/16][k/2][16][2], which is AMX's
 * B-tile layout; k is padded to 32.  The caller's tile configuration (oneDNN keeps one per
 * thread) is saved first and put back after.
 */
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Linux grants AMX's tile state per process on request; 0 when granted. */
int specui_amx_init(void) { return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); }

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Tiles 0-2 as 16 rows of 64 bytes (C, A, B), the caller's configuration kept in `saved`:
 * oneDNN keeps one per thread and expects to find it again. */
static void amx_begin(tile_config *saved) {
    tile_config cfg;
    _tile_storeconfig(saved);
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 3; ++t) cfg.rows[t] = TILE, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
}

static void amx_end(const tile_config *saved) {
    if (saved->palette) _tile_loadconfig(saved);
    else _tile_release();
}

/* x: [rows, k] bf16; wp: packed weights, kp a multiple of 32; bias: float32 or NULL;
 * out: [rows, n_out] float32.  Returns 0, or -1 when it cannot allocate its scratch. */
int specui_bf16_matmul(const uint16_t *x, int64_t rows, int64_t k, int64_t kp, const uint16_t *wp,
                       const float *bias, int64_t n_out, float *out) {
    const int64_t padded = (rows + TILE - 1) / TILE * TILE;
    uint16_t *xs = aligned_alloc(64, sizeof(uint16_t) * padded * kp);
    if (!xs) return -1;
    memset(xs, 0, sizeof(uint16_t) * padded * kp); /* rows past the block, and k past k: zero */
    for (int64_t i = 0; i < rows; ++i) memcpy(xs + i * kp, x + i * k, sizeof(uint16_t) * k);
    tile_config saved;
    float c[TILE * TILE] __attribute__((aligned(64)));
    amx_begin(&saved);
    /* A column of 16 channels' weights (kp x 32 bytes) stays in cache while every 16 rows pass. */
    for (int64_t o = 0; o < n_out; o += TILE) {
        const uint16_t *t0 = wp + (o / TILE) * kp * TILE;
        int64_t left = n_out - o < TILE ? n_out - o : TILE;
        for (int64_t r0 = 0; r0 < rows; r0 += TILE) {
            _tile_zero(0);
            for (int64_t ks = 0; ks < kp; ks += 32) {
                _tile_loadd(1, xs + r0 * kp + ks, kp * 2); /* 16 rows x 32 inputs */
                _tile_loadd(2, t0 + ks * TILE, 64);        /* 16 input pairs x 16 channels x 2 */
                _tile_dpbf16ps(0, 1, 2);
            }
            _tile_stored(0, c, 64);
            int64_t R = rows - r0 < TILE ? rows - r0 : TILE;
            for (int64_t i = 0; i < R; ++i)
                for (int64_t j = 0; j < left; ++j)
                    out[(r0 + i) * n_out + o + j] = bias ? c[i * TILE + j] + bias[o + j] : c[i * TILE + j];
        }
    }
    amx_end(&saved);
    free(xs);
    return 0;
}

/* Weights 4 KiB ahead into L2 while a pass of several rows computes: such a pass spends ~16 cycles
 * on each 128 bytes of weights, too slowly for the hardware prefetcher to keep enough lines in
 * flight, and it streamed from DRAM at ~14 GB/s of the ~26 one core reads.  With it a bf16 stream
 * of 8 rows takes about a fifth less time, a 9-row gguf verify a tenth (`bench/prefetch.py`,
 * which sets 0, off, against the default in one run).  A pass of fewer rows is already bound by
 * bytes, and the extra instructions only cost there. */
static int64_t prefetch_ahead = 4096;
#define PREFETCH_ROWS 4

/* Bytes ahead (0: off, at most 1 MiB); returns the previous distance. */
int specui_set_prefetch_ahead(int64_t bytes) {
    const int was = (int)prefetch_ahead;
    prefetch_ahead = bytes < 0 ? 0 : bytes > (1 << 20) ? (1 << 20) : bytes;
    return was;
}

/* A block's bytes, `ahead` bytes on, into L2 (nothing where ahead is 0). */
static inline __attribute__((always_inline)) void prefetch_block(const uint8_t *blk, int64_t bytes, int64_t ahead) {
    for (int64_t l = 0; ahead && l < bytes; l += 64) _mm_prefetch((const char *)blk + ahead + l, _MM_HINT_T1);
}

/* ---- The bf16 matmul on AVX512-BF16 (no AMX) -------------------------------------------------
 *
 * The drafters' product (specui.algorithms) where AMX is missing: 1 to a few dozen rows by each
 * weight, a stream through the weights that oneDNN reads at about half the speed one core
 * reaches.  Same operands and layout as specui_bf16_matmul ([channels/16][kp/2][16][2]): each
 * 64-byte load of weights (16 channels x 1 input pair) meets every row of a pass with vdpbf16ps
 * (pairs of bf16 products summed in float32), two tiles of channels at a time.  Each output sums
 * its pairs in input order whatever the row count, so a row gets the same bits alone as in a block.
 */
#define BF16_MAX_ROWS 12 /* rows per pass: 2 tiles x 12 rows = 24 accumulators */

static inline __attribute__((always_inline)) void bf16_pass(const uint32_t *xs, int64_t kp,
                                                            const uint16_t *wp, const float *bias,
                                                            float *out, int64_t n_out, int64_t o,
                                                            int R, int G) {
    __m512 acc[BF16_MAX_ROWS][2];
    for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    const int64_t ahead = R >= PREFETCH_ROWS ? prefetch_ahead : 0;
    const uint16_t *t0 = wp + (o / TILE) * kp * TILE, *t1 = t0 + kp * TILE;
    for (int64_t q = 0; q < kp / 2; ++q) {
        if (ahead) {
            _mm_prefetch((const char *)(t0 + q * 32) + ahead, _MM_HINT_T1);
            if (G > 1) _mm_prefetch((const char *)(t1 + q * 32) + ahead, _MM_HINT_T1);
        }
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(t0 + q * 32);
        __m512bh w1 = G > 1 ? (__m512bh)_mm512_loadu_si512(t1 + q * 32) : w0;
        for (int i = 0; i < R; ++i) {
            __m512bh xb = (__m512bh)_mm512_set1_epi32((int)xs[i * (kp / 2) + q]);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], xb, w0);
            if (G > 1) acc[i][1] = _mm512_dpbf16_ps(acc[i][1], xb, w1);
        }
    }
    for (int g = 0; g < G; ++g) {
        int64_t oc = o + g * TILE, left = n_out - oc;
        __mmask16 m = first_lanes(left);
        __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias + oc) : _mm512_setzero_ps();
        for (int i = 0; i < R; ++i)
            _mm512_mask_storeu_ps(out + i * n_out + oc, m, _mm512_add_ps(acc[i][g], b));
    }
}

/* One case per (rows, tiles), both constants in the pass, so its accumulators stay in registers. */
#define BF16_CASE(r) \
    case 2 * r: bf16_pass(xs, kp, wp, bias, out, n_out, o, r, 1); return; \
    case 2 * r + 1: bf16_pass(xs, kp, wp, bias, out, n_out, o, r, 2); return;
static void bf16_dispatch(const uint32_t *xs, int64_t kp, const uint16_t *wp, const float *bias,
                          float *out, int64_t n_out, int64_t o, int R, int G) {
    switch (2 * R + G - 1) {
        BF16_CASE(1) BF16_CASE(2) BF16_CASE(3) BF16_CASE(4) BF16_CASE(5) BF16_CASE(6)
        BF16_CASE(7) BF16_CASE(8) BF16_CASE(9) BF16_CASE(10) BF16_CASE(11) BF16_CASE(12)
    }
}

/* x: [rows, k] bf16; wp: packed weights, kp a multiple of 32; bias: float32 or NULL;
 * out: [rows, n_out] float32.  Returns 0, or -1 when it cannot allocate its scratch. */
int specui_bf16_matmul_avx512(const uint16_t *x, int64_t rows, int64_t k, int64_t kp,
                              const uint16_t *wp, const float *bias, int64_t n_out, float *out) {
    uint16_t *xs = (uint16_t *)x;
    if (k != kp) { /* rows read in whole pairs up to kp: a zero-padded copy */
        xs = calloc((size_t)(rows * kp), sizeof(uint16_t));
        if (!xs) return -1;
        for (int64_t i = 0; i < rows; ++i) memcpy(xs + i * kp, x + i * k, sizeof(uint16_t) * k);
    }
    const int64_t tiles = (n_out + TILE - 1) / TILE;
    for (int64_t r0 = 0; r0 < rows; r0 += BF16_MAX_ROWS) {
        int R = rows - r0 < BF16_MAX_ROWS ? (int)(rows - r0) : BF16_MAX_ROWS;
        const uint32_t *xr = (const uint32_t *)(xs + r0 * kp);
        for (int64_t t = 0; t < tiles; t += 2)
            bf16_dispatch(xr, kp, wp, bias, out + r0 * n_out, n_out, t * TILE, R,
                          t + 1 < tiles ? 2 : 1);
    }
    if (xs != x) free(xs);
    return 0;
}

/* ---- The int8 matmul on AMX ------------------------------------------------------------------
 *
 * The same product as specui_int8_matmul (oneDNN's bits: exact int32 sums, made float once,
 * times the channel's scale), with AMX's tdpbusd: 16 rows of uint8 activations by a 64 x 16
 * tile of int8 weights per instruction, so a verify block costs what a row costs, and, as in
 * the bf16 matmul, any row count runs.  Weights:
 * [channels/16][k/4][16][4] signed (`pack(wq, amx=True)`), k padded to 64; wsum: each channel's
 * sum of weights, for the zero point (sum((x - 128) w) = sum(x w) - 128 sum(w)).
 */
int specui_int8_matmul_amx(const uint8_t *x, int64_t rows, int64_t k, int64_t kp, const int8_t *wp,
                           const int32_t *wsum, const float *wscale, int64_t n_out, float *out) {
    const int64_t padded = (rows + TILE - 1) / TILE * TILE;
    uint8_t *xs = aligned_alloc(64, padded * kp);
    if (!xs) return -1;
    memset(xs, 128, padded * kp); /* padding: activation 0 (zero point 128), against weight 0 */
    for (int64_t i = 0; i < rows; ++i) memcpy(xs + i * kp, x + i * k, k);
    tile_config saved;
    int32_t c[TILE * TILE] __attribute__((aligned(64)));
    amx_begin(&saved);
    for (int64_t o = 0; o < n_out; o += TILE) {
        const int8_t *t0 = wp + (o / TILE) * kp * TILE;
        int64_t left = n_out - o < TILE ? n_out - o : TILE;
        for (int64_t r0 = 0; r0 < rows; r0 += TILE) {
            _tile_zero(0);
            for (int64_t ks = 0; ks < kp; ks += 64) {
                _tile_loadd(1, xs + r0 * kp + ks, kp); /* 16 rows x 64 inputs */
                _tile_loadd(2, t0 + ks * TILE, 64);    /* 16 input quads x 16 channels x 4 */
                _tile_dpbusd(0, 1, 2);
            }
            _tile_stored(0, c, 64);
            int64_t R = rows - r0 < TILE ? rows - r0 : TILE;
            for (int64_t i = 0; i < R; ++i)
                for (int64_t j = 0; j < left; ++j)
                    out[(r0 + i) * n_out + o + j] = (float)(c[i * TILE + j] - 128 * wsum[o + j]) * wscale[o + j];
        }
    }
    amx_end(&saved);
    free(xs);
    return 0;
}

/* ---- The gguf verifier's matmul: a GGUF file's own Q8_0 / Q4_0 / Q4_1 blocks ------------------
 *
 *   out[r][o] = sum_b ( d[o][b] * sum_i q[o][b][i] * x[r][32 b + i]  (+ m[o][b] * sum_i x[r][32 b + i]) )
 *
 * which is sum_k x[r][k] * w[o][k] for GGUF's w = q d (Q8_0), (q - 8) d (Q4_0, q - 8 taken as the
 * value), q d + m (Q4_1): float32 activations times the file's quantized values, float32 sums,
 * each block's sum scaled by its fp16 scale (and Q4_1's offset times the row's block sum).  So an
 * output is the float32 product on the dequantized weights up to the rounding of float32 sums
 * (`self_check` bounds it), and it never touches a re-quantized weight.
 *
 * Batch invariance by construction: each output is one accumulator lane that meets the blocks and
 * the inputs within a block in the same sequence whatever the row count (rows never share a lane,
 * and a row's block sums of x are its own), so a row's result is the same bits alone or in a
 * block of any size.
 *
 * Why float32 activations and not int8 ones (llama.cpp's Q8 rows and integer dot products): the
 * gguf precision is meant to be the file's model within float32 rounding; int8 rows would make it
 * another model, as the int8 precision is.  A step is a stream through the weights, and these are
 * 0.63 (Q4) and 1.06 (Q8) bytes a weight against int8's 1 and bf16's 2; the work per weight is
 * kept small instead: a 4-bit value becomes a float by one vpermps from a 16-entry table (it reads
 * only an index's low 4 bits, so no mask), the scales are applied once a block, not once a weight.
 *
 * Layout (`pack_gguf` in cpu_kernels.py): the channels in tiles of 16; per tile, per block of 32
 * inputs, the 16 channels' fp16 d, then (Q4_1) their fp16 m, then their values.  Q8_0: 32 x 16
 * int8 (16 channels innermost).  Q4: the file's 16 bytes a channel in four groups of 4 bytes, a
 * group's 16 channels side by side (one 32-bit lane a channel), so the 8 nibbles of a lane are
 * inputs 4j, 4j+16, 4j+1, 4j+17, ... (a file byte holds input i low and i + 16 high).
 */
#define GGUF_Q4_0 2
#define GGUF_Q4_1 3
#define GGUF_Q8_0 8
#define GGUF_MAX_ROWS 12 /* rows per pass: 2 x 12 accumulators, the rest of the registers for weights */

static inline int64_t gguf_tile_block_bytes(int type) {
    return type == GGUF_Q8_0 ? 32 + 32 * TILE : type == GGUF_Q4_1 ? 64 + 16 * TILE : 32 + 16 * TILE;
}

/* Q4_1: each row's total gains the block's fp16 offsets m times the row's block sum of inputs. */
static inline __attribute__((always_inline)) void add_offsets(__m512 *total, const uint8_t *blk,
                                                              const float *xsum, int64_t nb, int R) {
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
    for (int r = 0; r < R; ++r) total[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xsum[r * nb]), total[r]);
}

/* The R rows' 16 outputs from `o` (fewer where the channels end inside the tile). */
static inline __attribute__((always_inline)) void store_tile(const __m512 *total, float *out, int64_t n_out,
                                                             int64_t o, int R) {
    int64_t left = n_out - o;
    __mmask16 mask = first_lanes(left);
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(out + r * n_out + o, mask, total[r]);
}

static inline __attribute__((always_inline)) void gguf_pass(int type, const float *x, const float *xsum,
                                                            int64_t k, const uint8_t *tile, float *out,
                                                            int64_t n_out, int64_t o, int R) {
    __m512 total[GGUF_MAX_ROWS], part[GGUF_MAX_ROWS];
    for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_ps();
    const int64_t ahead = R >= PREFETCH_ROWS ? prefetch_ahead : 0;
    const int64_t step = gguf_tile_block_bytes(type), nb = k / 32;
    const __m512 values = type == GGUF_Q4_1 ? _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                                            : _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *blk = tile + b * step;
        prefetch_block(blk, step, ahead);
        const float *xb = x + b * 32;
        for (int r = 0; r < R; ++r) part[r] = _mm512_setzero_ps();
        if (type == GGUF_Q8_0) {
            const int8_t *qs = (const int8_t *)(blk + 32);
            for (int i = 0; i < 32; ++i) {
                __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qs + i * TILE))));
                for (int r = 0; r < R; ++r) part[r] = _mm512_fmadd_ps(w, _mm512_set1_ps(xb[r * k + i]), part[r]);
            }
        } else {
            const uint8_t *qs = blk + (type == GGUF_Q4_1 ? 64 : 32);
            for (int j = 0; j < 4; ++j) {
                const __m512i lanes = _mm512_loadu_si512(qs + j * 64);
                for (int s = 0; s < 8; ++s) {
                    __m512 w = _mm512_permutexvar_ps(s ? _mm512_srli_epi32(lanes, 4 * s) : lanes, values);
                    const int i = 4 * j + (s >> 1) + (s & 1) * 16;
                    for (int r = 0; r < R; ++r) part[r] = _mm512_fmadd_ps(w, _mm512_set1_ps(xb[r * k + i]), part[r]);
                }
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        for (int r = 0; r < R; ++r) total[r] = _mm512_fmadd_ps(part[r], d, total[r]);
        if (type == GGUF_Q4_1) add_offsets(total, blk, xsum + b, nb, R);
    }
    store_tile(total, out, n_out, o, R);
}

/* The type and R as constants, so each pass keeps its accumulators in registers. */
#define GPASS(t, r) case r: gguf_pass(t, x, xsum, k, tile, out, n_out, o, r); return;
#define GROWS(t) GPASS(t, 1) GPASS(t, 2) GPASS(t, 3) GPASS(t, 4) GPASS(t, 5) GPASS(t, 6) \
                 GPASS(t, 7) GPASS(t, 8) GPASS(t, 9) GPASS(t, 10) GPASS(t, 11) GPASS(t, 12)
static void gguf_dispatch(int type, const float *x, const float *xsum, int64_t k, const uint8_t *tile,
                          float *out, int64_t n_out, int64_t o, int R) {
    switch (type) {
    case GGUF_Q8_0: switch (R) { GROWS(GGUF_Q8_0) } return;
    case GGUF_Q4_1: switch (R) { GROWS(GGUF_Q4_1) } return;
    default: switch (R) { GROWS(GGUF_Q4_0) } return;
    }
}

/* A row's block sums of inputs, for Q4_1's offsets: in input order, a row on its own. */
static void block_sums(const float *x, int64_t nb, float *xsum) {
    for (int64_t b = 0; b < nb; ++b) {
        float s = 0.0f;
        for (int i = 0; i < 32; ++i) s += x[b * 32 + i];
        xsum[b] = s;
    }
}

int specui_gguf_matmul_float(int type, const float *x, int64_t rows, int64_t k, const uint8_t *wp,
                             int64_t n_out, float *out);
static int gguf_matmul_pieces(int type, const float *x, int64_t rows, int64_t k, const uint8_t *wp,
                              int64_t n_out, float *out);

/* x: [rows, k] float32, k a multiple of 32; wp: packed weights of n_out channels (padded to 16);
 * out: [rows, n_out] float32.  Returns 0, -1 without memory, -2 for a type or k it does not take.
 * Q4_0 / Q4_1 take the integer path below (`gguf_matmul_pieces`), Q8_0 the float one. */
int specui_gguf_matmul(int type, const float *x, int64_t rows, int64_t k, const uint8_t *wp,
                       int64_t n_out, float *out) {
    if ((type != GGUF_Q8_0 && type != GGUF_Q4_0 && type != GGUF_Q4_1) || k % 32 || k <= 0) return -2;
    if (type != GGUF_Q8_0) return gguf_matmul_pieces(type, x, rows, k, wp, n_out, out);
    return specui_gguf_matmul_float(type, x, rows, k, wp, n_out, out);
}

/* The float path for every type: each 4-bit value made a float and multiplied in float32. */
int specui_gguf_matmul_float(int type, const float *x, int64_t rows, int64_t k, const uint8_t *wp,
                             int64_t n_out, float *out) {
    if ((type != GGUF_Q8_0 && type != GGUF_Q4_0 && type != GGUF_Q4_1) || k % 32 || k <= 0) return -2;
    const int64_t nb = k / 32, tile_bytes = nb * gguf_tile_block_bytes(type);
    float *xsum = NULL;
    if (type == GGUF_Q4_1) {
        xsum = malloc(sizeof(float) * rows * nb);
        if (!xsum) return -1;
        for (int64_t r = 0; r < rows; ++r) block_sums(x + r * k, nb, xsum + r * nb);
    }
    /* Tiles outside, rows inside: a tile's weights (5-17 KiB) stay in cache while the passes of a
     * long block (a prefill) go over it. */
    for (int64_t o = 0; o < n_out; o += TILE) {
        const uint8_t *tile = wp + (o / TILE) * tile_bytes;
        for (int64_t r0 = 0; r0 < rows; r0 += GGUF_MAX_ROWS) {
            int R = rows - r0 < GGUF_MAX_ROWS ? (int)(rows - r0) : GGUF_MAX_ROWS;
            gguf_dispatch(type, x + r0 * k, xsum ? xsum + r0 * nb : NULL, k, tile, out + r0 * n_out, n_out, o, R);
        }
    }
    free(xsum);
    return 0;
}

/* ---- Q4 blocks in integers: each row's float32 block as three int8 pieces ------------------------
 *
 * A 4-bit value is already an integer, so the product of a block can be an integer dot product
 * (vpdpbusd: 64 multiply-adds an instruction, the nibbles used as they lie, a mask and a shift
 * for 32 of them) if the row is one too.  A row's block of 32 floats is split, with a power-of-two
 * step s (the smallest with max |x| <= 127 s), into x = s (p1 + p2 / 128 + p3 / 16384) + e:
 * p1 in [-127, 127], p2 and p3 in [-64, 64] (each the rounded remainder of the one before), and
 * |e| <= s / 32768, i.e. within 2^-21 of the block's largest input: float32 rounding's order
 * (2^-24 of each term) on the terms that decide the sum, not an int8 model of the row.
 *
 * Then sum_i q_i x_i = s (S1 + S2 / 128 + S3 / 16384) with S_j = sum_i q_i p_j,i exact int32 sums,
 * combined as one int32 (S1 << 14) + (S2 << 7) + S3 (below 2^31: 32 x 15 x 127 x 2^14 < 2^30),
 * one float conversion and one multiply-add by d s / 16384 a block.  Q4_0's offset of 8 is taken
 * off in the same integers (8 times the pieces' own block sum), so it cancels exactly; Q4_1's
 * offset m meets the row's float32 block sum as on the float path.
 *
 * Batch invariance as on the float path: the pieces are a row's own, and each output lane meets
 * the blocks in one order whatever the row count.  Six rows a pass (three int32 sums and a float
 * total each: 24 of the 32 registers).
 */
#define PIECE_ROWS 6

/* One row of k floats -> its pieces [k/32][3][32] (int8), its steps s / 16384 [k/32], and (Q4_0
 * only: offset8 not NULL) 8 x its pieces' block sums combined as S is [k/32]. */
static void split_row(const float *x, int64_t k, int8_t *pieces, float *step, int32_t *offset8) {
    const __m512 unit = _mm512_set1_ps(128.0f);
    for (int64_t b = 0; b < k / 32; ++b) {
        const __m512 a = _mm512_loadu_ps(x + 32 * b), c = _mm512_loadu_ps(x + 32 * b + 16);
        const __m512 big = _mm512_set1_ps(FLT_MAX);
        /* an inf or NaN input (max drops NaNs, so they are looked for on their own) */
        const int special = _mm512_cmp_ps_mask(_mm512_abs_ps(a), big, _CMP_NLE_UQ) |
                            _mm512_cmp_ps_mask(_mm512_abs_ps(c), big, _CMP_NLE_UQ);
        const float m = special ? 0.0f : _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(c)));
        int e = 0;
        if (m > 0.0f) { /* the smallest power of two s = 2^e with m <= 127 s */
            frexpf(m / 127.0f, &e);
            if (ldexpf(127.0f, e - 1) >= m) e -= 1;
            if (ldexpf(127.0f, e) < m) e += 1; /* m / 127 rounded down: p1 would reach 128 */
        }
        /* x / s in two exact power-of-two steps (2^-e alone overflows for inputs near 0) */
        const __m512 f1 = _mm512_set1_ps(ldexpf(1.0f, -e / 2)), f2 = _mm512_set1_ps(ldexpf(1.0f, -e - (-e / 2)));
        int32_t total = 0;
        for (int h = 0; h < 2; ++h) {
            __m512 r = _mm512_mul_ps(_mm512_mul_ps(h ? c : a, f1), f2);  /* |r| <= 127, in units of s */
            for (int j = 0; j < 3; ++j) {
                /* round to nearest (ties to even): the remainder, exact, stays within half a unit */
                const __m512 p = _mm512_roundscale_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                r = _mm512_mul_ps(_mm512_sub_ps(r, p), unit);
                const __m512i q = _mm512_cvtps_epi32(p);
                _mm_storeu_si128((__m128i *)(pieces + (b * 3 + j) * 32 + 16 * h), _mm512_cvtepi32_epi8(q));
                if (offset8) total += _mm512_reduce_add_epi32(q) << (14 - 7 * j);
            }
        }
        /* an inf or NaN input: a NaN scale carries it into every output, as a float sum would */
        step[b] = special ? NAN : ldexpf(1.0f, e - 14);
        if (offset8) offset8[b] = 8 * total;
    }
}

static inline __attribute__((always_inline)) void piece_pass(int type, const int8_t *pieces, const float *step,
                                                             const int32_t *offset8, const float *xsum, int64_t nb,
                                                             const uint8_t *tile, float *out, int64_t n_out,
                                                             int64_t o, int R) {
    __m512 total[PIECE_ROWS];
    for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_ps();
    const int64_t ahead = R >= PREFETCH_ROWS ? prefetch_ahead : 0;
    const int64_t bstep = gguf_tile_block_bytes(type);
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *blk = tile + b * bstep;
        const uint8_t *qs = blk + (type == GGUF_Q4_1 ? 64 : 32);
        prefetch_block(blk, bstep, ahead);
        __m512i acc[PIECE_ROWS][3];
        for (int r = 0; r < R; ++r)
            for (int j = 0; j < 3; ++j) acc[r][j] = _mm512_setzero_si512();
        for (int g = 0; g < 4; ++g) {
            /* a lane: 4 bytes of a channel, inputs 4g..4g+3 low and 4g+16..4g+19 high */
            const __m512i lanes = _mm512_loadu_si512(qs + g * 64);
            const __m512i lo = _mm512_and_si512(lanes, low), hi = _mm512_and_si512(_mm512_srli_epi32(lanes, 4), low);
            for (int r = 0; r < R; ++r) {
                const int8_t *p = pieces + (r * nb + b) * 96;
                for (int j = 0; j < 3; ++j) {
                    int32_t xl, xh;
                    memcpy(&xl, p + 32 * j + 4 * g, 4);
                    memcpy(&xh, p + 32 * j + 16 + 4 * g, 4);
                    acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], lo, _mm512_set1_epi32(xl));
                    acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], hi, _mm512_set1_epi32(xh));
                }
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        for (int r = 0; r < R; ++r) {
            __m512i sum = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(acc[r][0], 14), _mm512_slli_epi32(acc[r][1], 7)),
                                           acc[r][2]);
            if (type == GGUF_Q4_0) sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(offset8[r * nb + b]));
            total[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, _mm512_set1_ps(step[r * nb + b])), total[r]);
        }
        if (type == GGUF_Q4_1) add_offsets(total, blk, xsum + b, nb, R);
    }
    store_tile(total, out, n_out, o, R);
}

#define PPASS(t, r) case r: piece_pass(t, pieces, step, offset8, xsum, nb, tile, out, n_out, o, r); return;
static void piece_dispatch(int type, const int8_t *pieces, const float *step, const int32_t *offset8,
                           const float *xsum, int64_t nb, const uint8_t *tile, float *out, int64_t n_out,
                           int64_t o, int R) {
    if (type == GGUF_Q4_1) {
        switch (R) { PPASS(GGUF_Q4_1, 1) PPASS(GGUF_Q4_1, 2) PPASS(GGUF_Q4_1, 3) PPASS(GGUF_Q4_1, 4)
                     PPASS(GGUF_Q4_1, 5) PPASS(GGUF_Q4_1, 6) }
    } else {
        switch (R) { PPASS(GGUF_Q4_0, 1) PPASS(GGUF_Q4_0, 2) PPASS(GGUF_Q4_0, 3) PPASS(GGUF_Q4_0, 4)
                     PPASS(GGUF_Q4_0, 5) PPASS(GGUF_Q4_0, 6) }
    }
}

static int gguf_matmul_pieces(int type, const float *x, int64_t rows, int64_t k, const uint8_t *wp,
                              int64_t n_out, float *out) {
    const int64_t nb = k / 32, tile_bytes = nb * gguf_tile_block_bytes(type);
    int8_t *pieces = malloc((size_t)rows * nb * 96);
    float *step = malloc(sizeof(float) * rows * nb), *xsum = malloc(sizeof(float) * rows * nb);
    int32_t *offset8 = malloc(sizeof(int32_t) * rows * nb);
    if (!pieces || !step || !xsum || !offset8) {
        free(pieces); free(step); free(xsum); free(offset8);
        return -1;
    }
    for (int64_t r = 0; r < rows; ++r) {
        /* Q4_0 takes its offset off in the pieces' integers, Q4_1 adds m times the float sums */
        split_row(x + r * k, k, pieces + r * nb * 96, step + r * nb, type == GGUF_Q4_0 ? offset8 + r * nb : NULL);
        if (type == GGUF_Q4_1) block_sums(x + r * k, nb, xsum + r * nb);
    }
    for (int64_t o = 0; o < n_out; o += TILE) {
        const uint8_t *tile = wp + (o / TILE) * tile_bytes;
        for (int64_t r0 = 0; r0 < rows; r0 += PIECE_ROWS) {
            int R = rows - r0 < PIECE_ROWS ? (int)(rows - r0) : PIECE_ROWS;
            piece_dispatch(type, pieces + r0 * nb * 96, step + r0 * nb, offset8 + r0 * nb, xsum + r0 * nb, nb, tile,
                           out + r0 * n_out, n_out, o, R);
        }
    }
    free(pieces); free(step); free(xsum); free(offset8);
    return 0;
}

/* ---- Decoder layers in one call: the gguf verifier's, and the drafters' ----------------------
 *
 * A one-token gguf step is a stream through 60 MB of blocks (~13 ms at one core's bandwidth), yet
 * it took ~27 ms through `specui.verifier.decoder`'s torch ops: per layer some 35 of them (norms,
 * rotary, the KV writes, SiLU, residual adds, views) at a few microseconds each, plus their
 * allocations.  `specui_decoder_layers` runs every layer of a block of rows (a one-token step or a
 * verify block) on the kernels above with no torch in between: RMSNorm, the fused q/k/v matmul
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
#define WEIGHT_BF16 30 /* bf16 weights in pack_bf16's layout (GGML's number for BF16) */

typedef struct {
    int32_t type, amx; /* a GGUF block type or WEIGHT_BF16; amx: bf16 weights on the AMX kernel */
    const uint8_t *data;
    const float *bias; /* float32 [n_out] or NULL */
    int64_t k, n_out;
} specui_layer_weight;

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
static int64_t first_max(const float *row, int64_t n) {
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

static int weight_matmul(const specui_layer_weight *w, const float *x, int64_t rows, float *out) {
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

/* ---- A greedy chain of low-rank previous-token biases (DSpark's vanilla Markov head) ---------
 *
 * Slot k's logits are its base logits plus W2 W1[prev], where prev is the token slot k-1 drew (the
 * anchor for the first slot), so the slots go one after another: per slot the W1 row of prev, one
 * bf16 row through W2 (bf16_rows_matmul: the rounding BF16Linear gives it), the sum in float32 and
 * its first maximum (torch's argmax), mapped to the target vocabulary through d2t.  In torch that
 * is ~10 ops a slot; here one call for the block, with W2 warm in cache from the second slot on.
 *
 * base: [slots][n_out] float32; w1: [vocab][rank] bf16 (BF16Linear rounds its input to bf16
 * anyway, so a bf16 table gives the same rows); w2: bf16, k = rank; d2t: [n_out] target offsets or
 * NULL; forced: [slots] target ids fed instead of the drawn ones (tests), or NULL.  Out: logits
 * [slots][n_out], tokens [slots] (target ids).  Returns 0, -1 without memory, -2 on a previous
 * token outside the vocabulary.
 *
 * conf (or NULL): DSpark's confidence head on [hidden row; W1 row of prev] (bf16 weights, one
 * output and its bias), the slot's acceptance logit into conf_out [slots]; hidden: [slots][hidden_size].
 * The same 1-row bf16 product as BF16Linear's, so the torch head's bits; in the call it costs no
 * torch ops (about 0.2 ms a draft here).
 *
 * memo: [memo_rows][n_out] biases already computed, memo_token[i] the token whose bias row i holds
 * (-1: none), direct-mapped by token id.  A bias depends on its token alone, and drafts draw the
 * same common tokens step after step: a remembered one is a 32 KiB read instead of W2's 4 MiB
 * (rank 256 x 8192), with the very bits the matmul gives. */
int specui_markov_greedy(const float *base, int64_t slots, const uint16_t *w1, int64_t vocab,
                         const specui_layer_weight *w2, const int64_t *d2t, int64_t anchor,
                         const int64_t *forced, float *memo, int64_t *memo_token, int64_t memo_rows,
                         float *logits, int64_t *tokens, const float *hidden, int64_t hidden_size,
                         const specui_layer_weight *conf, float *conf_out) {
    const int64_t n = w2->n_out, rank = w2->k;
    if (conf && (conf->k != hidden_size + rank || conf->n_out != 1 || !hidden)) return -3;
    /* e: the W1 row of prev, after the slot's hidden row where the confidence head reads both */
    float *row_in = malloc((size_t)(hidden_size + rank) * sizeof(float));
    if (!row_in) return -1;
    float *e = conf ? row_in + hidden_size : row_in;
    int64_t prev = anchor;
    int rc = 0;
    for (int64_t s = 0; s < slots && rc == 0; ++s) {
        if (prev < 0 || prev >= vocab) {
            rc = -2;
            break;
        }
        float *bias = memo + (prev % memo_rows) * n;
        const int remembered = memo_token[prev % memo_rows] == prev;
        if (!remembered || conf)
            for (int64_t i = 0; i < rank; ++i) {
                const uint32_t bits = (uint32_t)w1[prev * rank + i] << 16;
                memcpy(e + i, &bits, sizeof bits);
            }
        if (conf) {
            memcpy(row_in, hidden + s * hidden_size, sizeof(float) * hidden_size);
            if ((rc = weight_matmul(conf, row_in, 1, conf_out + s)) != 0) break;
        }
        if (!remembered) {
            memo_token[prev % memo_rows] = -1;
            if ((rc = weight_matmul(w2, e, 1, bias)) != 0) break;
            memo_token[prev % memo_rows] = prev;
        }
        float *row = logits + s * n;
        const float *b = base + s * n;
        for (int64_t j = 0; j < n; ++j) row[j] = bias[j] + b[j];
        const int64_t best = first_max(row, n);
        tokens[s] = d2t ? best + d2t[best] : best;
        prev = forced ? forced[s] : tokens[s];
    }
    free(row_in);
    return rc;
}
