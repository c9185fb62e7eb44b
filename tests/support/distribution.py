"""The sampled-distribution check the lossless tests share: decode two tokens thousands of
times with seeds and compare the counts to the verifier's exact two-token distribution."""

from __future__ import annotations

from collections.abc import Callable

import torch
from scipy.stats import chisquare

from specui.engine import generate
from specui.sampling import process_logits


def exact_two_token_distribution(v, prompt, sampling) -> torch.Tensor:
    """P(x1, x2 | prompt) under the processed verifier distribution, by enumeration."""
    V = v.vocab_size
    first = process_logits(v.forward(torch.tensor(prompt)).logits[-1], sampling)
    table = torch.zeros(V, V, dtype=torch.float64)
    for x1 in range(V):
        if first[x1] == 0:
            continue
        second = process_logits(v.forward(torch.tensor([*prompt, x1])).logits[-1], sampling)
        table[x1] = first[x1].double() * second.double()
    return table.flatten()


def sampled_pvalue(
    v, prompt, sampling, n: int, drafter, policy: Callable[[], object] | None = None
) -> float:
    """Chi-square p-value of ``n`` seeded two-token decodes against the exact distribution;
    ``policy()`` makes each decode's policy (None: every draft sent)."""
    expected = exact_two_token_distribution(v, prompt, sampling)
    counts = torch.zeros_like(expected)
    V = v.vocab_size
    for seed in range(n):
        kwargs = {"policy": policy()} if policy is not None else {}
        out = generate(
            v,
            drafter,
            prompt,
            max_new_tokens=2,
            sampling=sampling,
            seed=seed,
            stop_on_eos=False,
            **kwargs,
        )
        x1, x2 = out.output_token_ids
        counts[x1 * V + x2] += 1
    # Pool cells with small expectation so the chi-square approximation holds.
    exp = expected * n
    big = exp >= 5
    f_obs = torch.cat([counts[big], counts[~big].sum(0, keepdim=True)])
    f_exp = torch.cat([exp[big], exp[~big].sum(0, keepdim=True)])
    keep = f_exp > 0
    f_obs, f_exp = f_obs[keep].numpy(), f_exp[keep].numpy()
    f_exp = f_exp * f_obs.sum() / f_exp.sum()  # float rounding only; the totals agree to 1e-7
    return float(chisquare(f_obs, f_exp).pvalue)
