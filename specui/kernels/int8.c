/* The int8 matmuls (specui/kernels/build.py builds every C file here into one library).
 * First: the int8 verifier's matmul for a few rows, on AVX512-VNNI.
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
 * output channels x 4 inputs, the layout `pack` in packing.py writes) meets every row of
 * the block in registers (AVX512-VNNI vpdpbusd), with no horizontal sums: one pass over the
 * weights for up to MAX_ROWS rows, at the memory's speed.
 *
 * vpdpbusd multiplies unsigned by signed bytes.  The weights are stored unsigned (w + 128)
 * and the activations made signed (x - 128), so the sum it returns is the wanted one plus
 * 128 * sum(x - 128), which is taken off exactly.
 */
#include "kernels.h"

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
