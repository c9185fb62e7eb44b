/* GGUF blocks times rows quantized per 32-block to int8: the integer dot-product rate.
 *
 * A verify block of 9 rows through this model is ~1.2 G multiply-adds.  In float32 (the `gguf`
 * kernels) each extra row costs ~1.1 ms at one core's FMA rate, so a 9-row verify cost ~3 one-row
 * steps and speculation rarely paid.  vpdpbusd (AVX512-VNNI) does 64 int8 multiply-adds an
 * instruction, four times the FMA's 16, so here each row is made int8 the way llama.cpp makes
 * it (its Q8_0 activations): per block of 32 inputs a float scale dx = max|x| / 127 and
 * q = round(x / dx) in [-127, 127].  A block's product with a weight block is then one exact
 * int32 sum S = sum_i w_i q_i, and the output gains d_w * dx * S, one float multiply-add a block.
 *
 * vpdpbusd multiplies unsigned by signed bytes, and the rows' bytes are the signed side (a row's
 * 4 bytes broadcast to the 16 channels of a tile, folded into the instruction), so the weights
 * are the unsigned side: Q4 nibbles are unsigned already (0..15, their offset 8 or m apart), and
 * Q8_0's values are stored + 128.  The offsets come back exactly in integers where they are
 * integers: S - 8 sum(q) for Q4_0, S - 128 sum(q) for Q8_0.  Q4_1's offset m is a float; it meets
 * the int8 row's block sum dx sum(q), as in llama.cpp's Q8_1 rows: each block is then exactly the
 * int8 row times the weights as they are.
 *
 * Batch invariance by construction: a row is quantized on its own, and each output lane meets
 * the blocks in one fixed order whatever the number of rows in the pass, so a row's bits are the
 * same alone (a one-token step) and inside a verify block.
 *
 * Layout (`pack_gguf(..., rows="int8")` in packing.py): tiles of 16 channels; per tile, per block of 32 inputs, the
 * 16 channels' fp16 d, then (Q4_1) their fp16 m, then the values: Q4 as the float kernel's (the
 * file's 16 bytes a channel in four groups of 4 bytes, a group's 16 channels side by side: one
 * 32-bit lane a channel, nibbles 4g..4g+3 low and 4g+16..4g+19 high); Q8_0 in eight groups of
 * 4 inputs, the 16 channels side by side (4 bytes a channel: one lane), each byte q + 128.
 */
#include "kernels.h"

/* 4 bytes of a row read as one int32 wherever they lie: the broadcast then folds into vpdpbusd's
 * memory operand ({1to16}) instead of taking a load and a shuffle of its own. */
typedef int32_t __attribute__((may_alias, aligned(1))) q8_four;
/* acc += w (unsigned bytes) . the 4 signed bytes at p, broadcast.  Written out because GCC 12
 * does not fold the intrinsics' broadcast into the instruction's memory operand, and the separate
 * broadcast loads cost up to ~15% of the Q8_0 head's rate at 9 rows. */
#define Q8_DOT(acc, w, p) \
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const q8_four *)(p)))
#define Q8_ROWS 12 /* rows per pass: an int32 and a float accumulator each, 24 of 32 registers */

static inline int64_t q8_block_bytes(int type) {
    return type == GGUF_Q8_0 ? 32 + 32 * TILE : type == GGUF_Q4_1 ? 64 + 16 * TILE : 32 + 16 * TILE;
}

/* One row of k floats as int8 blocks: q [k], dx [k/32], and per block the integer offset term
 * (off * sum q: 8 for Q4_0, 128 for Q8_0, 0 for Q4_1) and the int8 block sum dx sum q (Q4_1's m). */
static void quantize_row(const float *x, int64_t k, int off, int8_t *q, float *dx, int32_t *corr,
                         float *xsum) {
    for (int64_t b = 0; b < k / 32; ++b) {
        const __m512 a = _mm512_loadu_ps(x + 32 * b), c = _mm512_loadu_ps(x + 32 * b + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(c)));
        /* An inf or NaN input: a NaN scale carries it into every output, as a float sum would
         * (max drops NaNs, so they are looked for on their own). */
        const __mmask16 bad = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q);
        const float d = amax / 127.0f;
        const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        /* round to nearest, ties to even: |x * 127 / amax| <= 127, so no clamp is needed */
        const __m512i qa = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(a, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m512i qc = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(c, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm_storeu_si128((__m128i *)(q + 32 * b), _mm512_cvtsepi32_epi8(qa));
        _mm_storeu_si128((__m128i *)(q + 32 * b + 16), _mm512_cvtsepi32_epi8(qc));
        dx[b] = (bad || isinf(amax)) ? NAN : d;
        const int32_t sum_q = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qc));
        corr[b] = off * sum_q;
        /* Q4_1's offset m meets the block sum of the int8 row (dx sum q), not of the float one:
         * the block's product is then the int8 row times the weights as they are,
         * sum (d n_i + m) dx q_i.  With the float sum, the rounding of each input would meet
         * d n_i alone (0..15 d, never centred) and stop cancelling: ~2.5x the error. */
        xsum[b] = dx[b] * (float)sum_q;
    }
}

static inline __attribute__((always_inline)) void q8_pass(int type, const int8_t *q, const float *dx,
                                                          const int32_t *corr, const float *xsum,
                                                          int64_t k, const uint8_t *tile, float *out,
                                                          int64_t n_out, int64_t o, int R) {
    const int64_t nb = k / 32, bstep = q8_block_bytes(type);
    __m512 total[Q8_ROWS];
    for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *blk = tile + b * bstep;
        __m512i acc[Q8_ROWS];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_si512();
        if (type == GGUF_Q8_0) {
            const uint8_t *qs = blk + 32;
            for (int g = 0; g < 8; ++g) {
                const __m512i w = _mm512_loadu_si512(qs + 64 * g);
                for (int r = 0; r < R; ++r) Q8_DOT(acc[r], w, q + r * k + 32 * b + 4 * g);
            }
        } else {
            const uint8_t *qs = blk + (type == GGUF_Q4_1 ? 64 : 32);
            for (int g = 0; g < 4; ++g) {
                const __m512i lanes = _mm512_loadu_si512(qs + 64 * g);
                const __m512i lo = _mm512_and_si512(lanes, low);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(lanes, 4), low);
                for (int r = 0; r < R; ++r) {
                    const int8_t *p = q + r * k + 32 * b + 4 * g;
                    Q8_DOT(acc[r], lo, p);
                    Q8_DOT(acc[r], hi, p + 16);
                }
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        for (int r = 0; r < R; ++r) {
            const __m512i s = type == GGUF_Q4_1 ? acc[r] : _mm512_sub_epi32(acc[r], _mm512_set1_epi32(corr[r * nb + b]));
            total[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(dx[r * nb + b])), total[r]);
        }
        if (type == GGUF_Q4_1) {
            const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
            for (int r = 0; r < R; ++r) total[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xsum[r * nb + b]), total[r]);
        }
    }
    const __mmask16 mask = first_lanes(n_out - o);
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(out + r * n_out + o, mask, total[r]);
}

#define Q8PASS(t, r) case r: q8_pass(t, q, dx, corr, xsum, k, tile, out, n_out, o, r); return;
#define Q8ROWS(t) Q8PASS(t, 1) Q8PASS(t, 2) Q8PASS(t, 3) Q8PASS(t, 4) Q8PASS(t, 5) Q8PASS(t, 6) \
                  Q8PASS(t, 7) Q8PASS(t, 8) Q8PASS(t, 9) Q8PASS(t, 10) Q8PASS(t, 11) Q8PASS(t, 12)
static void q8_dispatch(int type, const int8_t *q, const float *dx, const int32_t *corr, const float *xsum,
                        int64_t k, const uint8_t *tile, float *out, int64_t n_out, int64_t o, int R) {
    switch (type) {
    case GGUF_Q8_0: switch (R) { Q8ROWS(GGUF_Q8_0) } return;
    case GGUF_Q4_1: switch (R) { Q8ROWS(GGUF_Q4_1) } return;
    default: switch (R) { Q8ROWS(GGUF_Q4_0) } return;
    }
}

/* x: [rows, k] float32, k a multiple of 32; wp: the int8-rows layout of n_out channels (padded to
 * 16); out: [rows, n_out] float32.  Returns 0, -1 without memory, -2 for a type or k it does not
 * take.  `specui_gguf_matmul` comes here for a type with GGUF_INT8_ROWS set. */
INTERNAL int gguf_q8_matmul(int type, const float *x, int64_t rows, int64_t k, const uint8_t *wp,
                          int64_t n_out, float *out) {
    if ((type != GGUF_Q8_0 && type != GGUF_Q4_0 && type != GGUF_Q4_1) || k % 32 || k <= 0) return -2;
    const int64_t nb = k / 32, tile_bytes = nb * q8_block_bytes(type);
    const int off = type == GGUF_Q8_0 ? 128 : type == GGUF_Q4_0 ? 8 : 0;
    int8_t *q = malloc((size_t)rows * k);
    float *dx = malloc(sizeof(float) * rows * nb), *xsum = malloc(sizeof(float) * rows * nb);
    int32_t *corr = malloc(sizeof(int32_t) * rows * nb);
    if (!q || !dx || !xsum || !corr) {
        free(q); free(dx); free(xsum); free(corr);
        return -1;
    }
    for (int64_t r = 0; r < rows; ++r) quantize_row(x + r * k, k, off, q + r * k, dx + r * nb, corr + r * nb, xsum + r * nb);
    /* Tiles outside, rows inside: a tile's blocks (6-10 KiB) stay in L1 while the passes of a
     * long block (a prefill) go over them. */
    /* Rows in passes of equal size (13 rows: 7 and 6, not 12 and 1): a pass's loads and nibble
     * unpacking are shared by its rows, so a one-row pass costs almost what a full one does.  A
     * row's bits do not depend on its pass. */
    const int64_t passes = (rows + Q8_ROWS - 1) / Q8_ROWS, per_pass = (rows + passes - 1) / passes;
    for (int64_t o = 0; o < n_out; o += TILE) {
        const uint8_t *tile = wp + (o / TILE) * tile_bytes;
        for (int64_t r0 = 0; r0 < rows; r0 += per_pass) {
            const int R = rows - r0 < per_pass ? (int)(rows - r0) : (int)per_pass;
            q8_dispatch(type, q + r0 * k, dx + r0 * nb, corr + r0 * nb, xsum + r0 * nb, k, tile, out + r0 * n_out, n_out, o, R);
        }
    }
    free(q); free(dx); free(xsum); free(corr);
    return 0;
}
