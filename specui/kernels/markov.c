#include "kernels.h"

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
