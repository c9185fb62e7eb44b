/* What SpecUI's CPU kernels share (every C file in specui/kernels, built into one library by
 * specui/kernels/build.py): the tile width, the inline helpers of the passes, AMX's tile
 * configuration, the layer weight the one-call layers and the Markov chain read, and the
 * functions one file defines for another.
 *
 * The helpers a pass calls in its inner loop stay always_inline: a call there spills the pass's
 * accumulators, which were measured 9% slower. */
#ifndef SPECUI_KERNELS_H
#define SPECUI_KERNELS_H

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <float.h>
#include <math.h>
#include <string.h>

/* Defined in one file for another: hidden, so the library exports only its specui_* entry points. */
#define INTERNAL __attribute__((visibility("hidden")))

#define TILE 16     /* output channels per accumulator (16 int32 lanes) */

/* The first n of 16 lanes (all 16 where n >= 16): a row's tail, or a tile's last channels. */
static inline __attribute__((always_inline)) __mmask16 first_lanes(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}

/* The weight prefetch of the passes of PREFETCH_ROWS rows or more (bf16.c says why). */
#define PREFETCH_ROWS 4
INTERNAL extern int64_t prefetch_ahead; /* bytes ahead, 0: off (specui_set_prefetch_ahead) */

/* A block's bytes, `ahead` bytes on, into L2 (nothing where ahead is 0). */
static inline __attribute__((always_inline)) void prefetch_block(const uint8_t *blk, int64_t bytes, int64_t ahead) {
    for (int64_t l = 0; ahead && l < bytes; l += 64) _mm_prefetch((const char *)blk + ahead + l, _MM_HINT_T1);
}

/* e^x for x <= 0 (Cephes' single-precision polynomial after x = n ln2 + r), 16 lanes: the
 * attention's softmax and the layers' SiLU. */
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

/* AMX's tile configuration (LDTILECFG's 64 bytes), for the AMX int8 and bf16 matmuls. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Tiles 0-2 as 16 rows of 64 bytes (C, A, B), the caller's configuration kept in `saved`:
 * oneDNN keeps one per thread and expects to find it again. */
static inline void amx_begin(tile_config *saved) {
    tile_config cfg;
    _tile_storeconfig(saved);
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 3; ++t) cfg.rows[t] = TILE, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
}

static inline void amx_end(const tile_config *saved) {
    if (saved->palette) _tile_loadconfig(saved);
    else _tile_release();
}

/* One matmul's weights as the one-call layers (layers.c) and the Markov chain (markov.c) read
 * them; specui/kernels/layers.py mirrors it field for field. */
#define WEIGHT_BF16 30 /* bf16 weights in pack_bf16's layout (GGML's number for BF16) */

typedef struct {
    int32_t type, amx; /* a GGUF block type or WEIGHT_BF16; amx: bf16 weights on the AMX kernel */
    const uint8_t *data;
    const float *bias; /* float32 [n_out] or NULL */
    int64_t k, n_out;
} specui_layer_weight;

/* bf16.c */
int specui_bf16_matmul(const uint16_t *x, int64_t rows, int64_t k, int64_t kp, const uint16_t *wp,
                       const float *bias, int64_t n_out, float *out);
int specui_bf16_matmul_avx512(const uint16_t *x, int64_t rows, int64_t k, int64_t kp,
                              const uint16_t *wp, const float *bias, int64_t n_out, float *out);

/* GGUF block types (GGML's numbers), and the flag that asks for rows quantized to int8 per block
 * of 32 (gguf_q8.c) instead of float32 rows (gguf.c): its own weight layout for Q8_0. */
#define GGUF_Q4_0 2
#define GGUF_Q4_1 3
#define GGUF_Q8_0 8
#define GGUF_INT8_ROWS 64

/* gguf_q8.c */
INTERNAL int gguf_q8_matmul(int type, const float *x, int64_t rows, int64_t k, const uint8_t *wp,
                            int64_t n_out, float *out);

/* gguf.c: either kernel, by the type's GGUF_INT8_ROWS flag */
int specui_gguf_matmul(int type, const float *x, int64_t rows, int64_t k, const uint8_t *wp,
                       int64_t n_out, float *out);

/* attention.c: row-wise causal attention (see_block: every row sees the whole block) */
INTERNAL int attention_rows(const float *q, int64_t rows, int64_t heads, int64_t d, const float *k,
                            const float *v, int64_t kv_heads, int64_t head_stride, int64_t start,
                            float scale, int64_t see_block, float *out);

/* layers.c: torch.argmax's pick on a row; a layer weight's matmul (bf16 or GGUF blocks) */
INTERNAL int64_t first_max(const float *row, int64_t n);
INTERNAL int weight_matmul(const specui_layer_weight *w, const float *x, int64_t rows, float *out);

#endif
