"""Suffix decoding: the trie counts every substring, the draft is the most frequent continuation
of the best-scoring match (checked against counting by brute force), vLLM's settings bound it,
and earlier outputs are remembered only when asked."""

from __future__ import annotations

import random

import pytest
import torch

from specui.algorithms.base import DraftContext
from specui.algorithms.resolve import resolve_drafter
from specui.algorithms.suffix import SuffixConfig, SuffixDrafter, SuffixTrie
from specui.errors import SpecUIError
from specui.trace import SamplingParams


def _ctx(tokens: list[int]) -> DraftContext:
    return DraftContext(torch.tensor(tokens), None, SamplingParams(), None)


def _occurrences(text: list[int], sub: list[int]) -> int:
    return sum(text[i : i + len(sub)] == sub for i in range(len(text) - len(sub) + 1))


def _node(trie: SuffixTrie, sub: list[int]):
    node = trie.root
    for t in sub:
        node = node.children.get(t)
        if node is None:
            return None
    return node


def test_trie_counts_every_substring_up_to_its_depth_and_forgets_a_removed_text():
    rng = random.Random(0)
    for trial in range(20):
        depth = rng.randint(2, 6)
        texts = [[rng.randrange(4) for _ in range(rng.randint(1, 40))] for _ in range(3)]
        trie = SuffixTrie(depth)
        for text in texts:
            trie.start_text()
            trie.extend(text)
        for _ in range(50):
            sub = [rng.randrange(4) for _ in range(rng.randint(1, depth))]
            expected = sum(_occurrences(t, sub) for t in texts)
            node = _node(trie, sub)
            assert (node.count if node else 0) == expected, (trial, sub)
        assert _node(trie, [0] * (depth + 1)) is None  # nothing deeper than the depth
        trie.remove_text(texts[1])
        for _ in range(50):
            sub = [rng.randrange(4) for _ in range(rng.randint(1, depth))]
            expected = _occurrences(texts[0], sub) + _occurrences(texts[2], sub)
            node = _node(trie, sub)
            assert (node.count if node else 0) == expected, (trial, sub)


def _reference_draft(text: list[int], k: int, config: SuffixConfig) -> list[int]:
    """The same rule by counting in the text: for each suffix length m, follow the most frequent
    next token while the product of shares stays >= min_token_prob; keep the best score."""
    depth = config.suffix_decoding_max_tree_depth
    best, best_score = [], 0.0
    for m in range(min(depth - 1, len(text)), 0, -1):  # the longest match wins a tie
        path = text[len(text) - m :]
        limit = min(k, int(config.suffix_decoding_max_spec_factor * m))
        draft, score, survive = [], 0.0, 1.0
        while len(draft) < limit and len(path) < depth:
            follow: dict[int, int] = {}
            for i in range(len(text) - len(path)):
                if text[i : i + len(path)] == path:
                    follow[text[i + len(path)]] = follow.get(text[i + len(path)], 0) + 1
            if not follow:
                break
            token = max(follow, key=lambda t: (follow[t], -t))
            share = follow[token] / sum(follow.values())
            if survive * share < config.suffix_decoding_min_token_prob:
                break
            survive *= share
            score += survive
            draft.append(token)
            path = [*path, token]
        if score > best_score:
            best, best_score = draft, score
    return best


def test_drafts_equal_a_brute_force_count_of_the_context():
    rng = random.Random(1)
    for trial in range(40):
        config = SuffixConfig(
            suffix_decoding_max_tree_depth=rng.randint(3, 8),
            suffix_decoding_max_spec_factor=rng.choice([0.5, 1.0, 2.0]),
            suffix_decoding_min_token_prob=rng.choice([0.0, 0.1, 0.4]),
        )
        k = rng.randint(1, 6)
        drafter = SuffixDrafter(k, config)
        text = [rng.randrange(3) for _ in range(rng.randint(1, 12))]
        for _ in range(6):  # the request grows as the engine appends
            proposal = drafter.propose(_ctx(text))
            assert proposal.token_ids == _reference_draft(text, k, config), (trial, text)
            text += [rng.randrange(3) for _ in range(rng.randint(1, 3))]


def test_proposes_the_most_frequent_continuation_with_its_share():
    a, b, c, x, y = 1, 2, 3, 4, 5
    text = [a, b, c, x, 9, a, b, c, y, 8, a, b, c, x, 7, a, b, c]
    proposal = SuffixDrafter(1).propose(_ctx(text))
    assert proposal.token_ids == [x]
    assert proposal.confidences == pytest.approx([2 / 3])
    # The share cut: min_token_prob above 2/3 leaves no draft.
    strict = SuffixConfig(suffix_decoding_min_token_prob=0.7)
    assert SuffixDrafter(4, strict).propose(_ctx(text)).token_ids == []


def test_earlier_outputs_are_drafted_from_only_when_cached():
    prompt, output = [1, 2, 3], [10, 11, 12, 13, 14, 15]
    for cached, expected in ((0, []), (1, [13, 14, 15])):
        drafter = SuffixDrafter(3, SuffixConfig(suffix_decoding_max_cached_requests=cached))
        drafter.reset()
        drafter.propose(_ctx(prompt))
        drafter.propose(_ctx(prompt + output))  # the request ends here
        drafter.reset()  # the next request: the last output joins the cache (when kept)
        assert drafter.propose(_ctx([7, 7, 10, 11, 12])).token_ids == expected


def test_the_cache_keeps_at_most_its_number_of_outputs():
    drafter = SuffixDrafter(2, SuffixConfig(suffix_decoding_max_cached_requests=1))
    for output in ([20, 21, 22, 23], [30, 31, 32, 33]):
        drafter.reset()
        drafter.propose(_ctx([1]))
        drafter.propose(_ctx([1, *output]))
    drafter.reset()
    assert drafter.propose(_ctx([5, 30, 31])).token_ids == [32, 33]
    assert drafter.propose(_ctx([6, 20, 21])).token_ids == []  # evicted


def test_settings_use_vllms_names_and_bad_ones_are_refused(fixture_verifier):
    d = resolve_drafter("suffix", fixture_verifier, None, suffix_decoding_max_tree_depth=12)
    assert isinstance(d, SuffixDrafter) and d.num_speculative_tokens == 12  # vLLM's default K
    assert d.stored_settings["suffix_decoding_max_tree_depth"] == 12
    assert set(d.stored_settings) == {
        "suffix_decoding_max_tree_depth",
        "suffix_decoding_max_cached_requests",
        "suffix_decoding_max_spec_factor",
        "suffix_decoding_min_token_prob",
    }
    with pytest.raises(SpecUIError, match="max_tree_depth"):
        SuffixConfig(suffix_decoding_max_tree_depth=1)
    with pytest.raises(SpecUIError, match="min_token_prob"):
        SuffixConfig(suffix_decoding_min_token_prob=1.5)


def test_vllm_gets_its_suffix_method_and_a_hybrid_is_refused_with_the_reason():
    from specui.vllm.launch_plan import build_speculative_config, speculator_algorithm

    cfg = build_speculative_config("suffix", 6)
    assert cfg == {"method": "suffix", "num_speculative_tokens": 6, **SuffixConfig().settings()}
    assert speculator_algorithm("suffix") == "suffix"
    for call in (build_speculative_config, speculator_algorithm):
        with pytest.raises(SpecUIError, match="vLLM has no method") as e:
            call("dflash+suffix", *([None] if call is build_speculative_config else []))
        assert "local engine" in str(e.value)
