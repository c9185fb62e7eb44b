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
#include <math.h>
#include <string.h>

#define TILE 16     /* output channels per accumulator (16 int32 lanes) */
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
        __mmask16 m = left >= TILE ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
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
 * whatever the other rows of the call: the scores in key order, their maximum, exp(s - max)
 * summed 16 lanes at a time from key 0, then the values summed in key order.  So a token's
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

/* q: [rows][heads][d]; k, v: kv_heads x (start + rows) keys, at k + g * head_stride + j * d;
 * out: [rows][heads][d].  d a multiple of 16.  Returns 0, -1 without memory, -2 on bad shapes. */
int specui_attention_rows(const float *q, int64_t rows, int64_t heads, int64_t d, const float *k,
                          const float *v, int64_t kv_heads, int64_t head_stride, int64_t start,
                          float scale, float *out) {
    if (d % 16 || d / 16 > MAX_HEAD_CHUNKS || kv_heads <= 0 || heads % kv_heads) return -2;
    const int64_t chunks = d / 16, group = heads / kv_heads, longest = start + rows;
    float *scores = malloc(sizeof(float) * (longest + 16));
    if (!scores) return -1;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t len = start + r + 1;
        for (int64_t h = 0; h < heads; ++h) {
            const float *qh = q + (r * heads + h) * d;
            const float *kg = k + (h / group) * head_stride, *vg = v + (h / group) * head_stride;
            __m512 qv[MAX_HEAD_CHUNKS];
            for (int64_t c = 0; c < chunks; ++c) qv[c] = _mm512_loadu_ps(qh + c * 16);
            float top = -INFINITY;
            for (int64_t j = 0; j < len; ++j) {
                const float *kj = kg + j * d;
                __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kj));
                for (int64_t c = 1; c < chunks; ++c) acc = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kj + c * 16), acc);
                float s = _mm512_reduce_add_ps(acc) * scale;
                scores[j] = s;
                top = s > top ? s : top;
            }
            __m512 total = _mm512_setzero_ps();
            for (int64_t j = 0; j < len; j += 16) {
                int64_t left = len - j;
                __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
                __m512 s = _mm512_maskz_loadu_ps(m, scores + j);
                __m512 p = _mm512_maskz_mov_ps(m, exp_nonpositive(_mm512_sub_ps(s, _mm512_set1_ps(top))));
                _mm512_mask_storeu_ps(scores + j, m, p);
                total = _mm512_add_ps(total, p);
            }
            __m512 o[MAX_HEAD_CHUNKS];
            for (int64_t c = 0; c < chunks; ++c) o[c] = _mm512_setzero_ps();
            for (int64_t j = 0; j < len; ++j) {
                __m512 p = _mm512_set1_ps(scores[j]);
                const float *vj = vg + j * d;
                for (int64_t c = 0; c < chunks; ++c) o[c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vj + c * 16), o[c]);
            }
            __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(total));
            float *oh = out + (r * heads + h) * d;
            for (int64_t c = 0; c < chunks; ++c) _mm512_storeu_ps(oh + c * 16, _mm512_mul_ps(o[c], inv));
        }
    }
    free(scores);
    return 0;
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

static inline __attribute__((always_inline)) void gguf_pass(int type, const float *x, const float *xsum,
                                                            int64_t k, const uint8_t *tile, float *out,
                                                            int64_t n_out, int64_t o, int R) {
    __m512 total[GGUF_MAX_ROWS], part[GGUF_MAX_ROWS];
    for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_ps();
    const int64_t step = gguf_tile_block_bytes(type), nb = k / 32;
    const __m512 values = type == GGUF_Q4_1 ? _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                                            : _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *blk = tile + b * step;
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
        if (type == GGUF_Q4_1) {
            const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
            for (int r = 0; r < R; ++r) total[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xsum[r * nb + b]), total[r]);
        }
    }
    int64_t left = n_out - o;
    __mmask16 mask = left >= TILE ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(out + r * n_out + o, mask, total[r]);
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

/* x: [rows, k] float32, k a multiple of 32; wp: packed weights of n_out channels (padded to 16);
 * out: [rows, n_out] float32.  Returns 0, -1 without memory, -2 for a type or k it does not take. */
int specui_gguf_matmul(int type, const float *x, int64_t rows, int64_t k, const uint8_t *wp,
                       int64_t n_out, float *out) {
    if ((type != GGUF_Q8_0 && type != GGUF_Q4_0 && type != GGUF_Q4_1) || k % 32 || k <= 0) return -2;
    const int64_t nb = k / 32, tile_bytes = nb * gguf_tile_block_bytes(type);
    float *xsum = NULL;
    if (type == GGUF_Q4_1) { /* each row's block sums, for the offsets: in input order, a row on its own */
        xsum = malloc(sizeof(float) * rows * nb);
        if (!xsum) return -1;
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t b = 0; b < nb; ++b) {
                float s = 0.0f;
                for (int i = 0; i < 32; ++i) s += x[r * k + b * 32 + i];
                xsum[r * nb + b] = s;
            }
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
