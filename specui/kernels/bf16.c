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
#include "kernels.h"
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Linux grants AMX's tile state per process on request; 0 when granted. */
int specui_amx_init(void) { return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); }

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
int64_t prefetch_ahead = 4096; /* PREFETCH_ROWS (kernels.h): the passes that prefetch */

/* Bytes ahead (0: off, at most 1 MiB); returns the previous distance. */
int specui_set_prefetch_ahead(int64_t bytes) {
    const int was = (int)prefetch_ahead;
    prefetch_ahead = bytes < 0 ? 0 : bytes > (1 << 20) ? (1 << 20) : bytes;
    return was;
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
