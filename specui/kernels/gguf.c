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
 * Layout (`pack_gguf` in packing.py): the channels in tiles of 16; per tile, per block of 32
 * inputs, the 16 channels' fp16 d, then (Q4_1) their fp16 m, then their values.  Q8_0: 32 x 16
 * int8 (16 channels innermost).  Q4: the file's 16 bytes a channel in four groups of 4 bytes, a
 * group's 16 channels side by side (one 32-bit lane a channel), so the 8 nibbles of a lane are
 * inputs 4j, 4j+16, 4j+1, 4j+17, ... (a file byte holds input i low and i + 16 high).
 */
#include "kernels.h"

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
 * Q4_0 / Q4_1 take the integer path below (`gguf_matmul_pieces`), Q8_0 the float one; a type with
 * GGUF_INT8_ROWS set goes to gguf_q8.c (rows quantized to int8, the `gguf-q8` precision). */
int specui_gguf_matmul(int type, const float *x, int64_t rows, int64_t k, const uint8_t *wp,
                       int64_t n_out, float *out) {
    if (type & GGUF_INT8_ROWS) return gguf_q8_matmul(type & ~GGUF_INT8_ROWS, x, rows, k, wp, n_out, out);
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
