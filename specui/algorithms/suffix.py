"""Suffix decoding (Oliaro et al. 2024, "SuffixDecoding"; vLLM's ``suffix`` method): a
model-free drafter that looks the context's last tokens up in a suffix tree of the prompt and
this request's output (and, optionally, earlier requests' outputs) and proposes the most
frequent continuation.

The tree here is a trie of every substring of at most ``suffix_decoding_max_tree_depth``
tokens, each node counting how often its substring occurs.  Appending one token extends the
``depth`` open suffixes by one node each, so keeping it up to date costs O(depth) a token.  The
nodes of the current text's own suffixes are exactly those open suffixes, so matching the
context is free; a suffix with children has occurred before and been followed.

From each matched suffix (length m) the draft follows the most frequent child while the
product of the children's shares (each a count over the node's continuations) stays at least
``suffix_decoding_min_token_prob``, for at most ``min(K, max_spec_factor * m)`` tokens.  Its
score is the sum of those products: the expected number of accepted tokens if the shares are
the acceptance probabilities.  The best-scoring match wins, as SuffixDecoding scores them.  The
shares go out as the proposal's per-slot confidences: each is read from the node the earlier
drafts reached, so it is known before the slot's own token (the policy may use it; see
``specui.policy``).

Torch is needed only for the context tensor; the tree is plain Python.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specui.algorithms.base import DraftContext
from specui.errors import SpecUIError
from specui.trace import Proposal

# vLLM's names (``--speculative-config``); SpecUI stores and shows them the same way.
OPTION_NAMES = (
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
)


@dataclass(frozen=True)
class SuffixConfig:
    """The suffix drafter's settings, under vLLM's names.

    ``max_cached_requests`` defaults to 0 here (vLLM: 10000): earlier outputs make a run
    depend on what ran before it in the same process, which a benchmark should opt into."""

    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 0
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1

    def __post_init__(self) -> None:
        depth, cached = (
            self.suffix_decoding_max_tree_depth,
            self.suffix_decoding_max_cached_requests,
        )
        for name, value in (("max_tree_depth", depth), ("max_cached_requests", cached)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpecUIError(f"suffix_decoding_{name} must be an integer, got {value!r}")
        if not 2 <= depth <= 256:
            raise SpecUIError(f"suffix_decoding_max_tree_depth must be in 2..256, got {depth}")
        if cached < 0:
            raise SpecUIError(f"suffix_decoding_max_cached_requests must be >= 0, got {cached}")
        factor, prob = self.suffix_decoding_max_spec_factor, self.suffix_decoding_min_token_prob
        if not (isinstance(factor, int | float) and factor > 0):
            raise SpecUIError(f"suffix_decoding_max_spec_factor must be > 0, got {factor!r}")
        if not (isinstance(prob, int | float) and 0 <= prob <= 1):
            raise SpecUIError(f"suffix_decoding_min_token_prob must be in [0, 1], got {prob!r}")

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> SuffixConfig:
        """The config named by ``options`` (other keys and None values ignored)."""
        return cls(
            **{k: v for k, v in (options or {}).items() if k in OPTION_NAMES and v is not None}
        )

    def settings(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in OPTION_NAMES}


class _Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.count = 0


class SuffixTrie:
    """Every substring of at most ``depth`` tokens of the texts added, with occurrence counts."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root = _Node()
        # open[j]: the node of the current text's suffix of length j (open[0] is the root).
        self.open: list[_Node] = [self.root]

    def start_text(self) -> None:
        """The next tokens begin a new text (no substring spans two texts)."""
        self.open = [self.root]

    def append(self, token: int, delta: int = 1) -> None:
        """Add ``token`` to the current text (``delta`` -1 takes an earlier text back out)."""
        opened = [self.root]
        for node in self.open[: self.depth]:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node()
            child.count += delta
            if child.count <= 0:
                del node.children[token]
            opened.append(child)
        self.open = opened

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.append(t)

    def remove_text(self, tokens: Sequence[int]) -> None:
        """Take a whole earlier text back out (the cache of earlier outputs evicts with this)."""
        self.start_text()
        for t in tokens:
            self.append(t, -1)
        self.start_text()

    def matches(self, context: Sequence[int]) -> list[tuple[int, _Node]]:
        """(m, node) for each suffix of ``context`` of length m >= 1 the trie holds, longest first
        (walked from the root: for a trie the context was not appended to)."""
        found = []
        for m in range(min(self.depth - 1, len(context)), 0, -1):
            node: _Node | None = self.root
            for t in context[len(context) - m :]:
                node = node.children.get(t) if node is not None else None
            if node is not None and node.children:
                found.append((m, node))
        return found


def best_path(
    matches: Sequence[tuple[int, _Node]], max_tokens: int, config: SuffixConfig
) -> tuple[list[int], list[float], float]:
    """The best-scoring draft over ``matches``: (tokens, each slot's share, score)."""
    best: tuple[list[int], list[float], float] = ([], [], 0.0)
    for m, node in matches:
        limit = min(max_tokens, int(config.suffix_decoding_max_spec_factor * m))
        tokens: list[int] = []
        shares: list[float] = []
        score, survive = 0.0, 1.0
        while len(tokens) < limit and node.children:
            total = sum(c.count for c in node.children.values())
            # The most frequent child; the lower token id on a tie, so drafts are reproducible.
            token, child = max(node.children.items(), key=lambda kv: (kv[1].count, -kv[0]))
            share = child.count / total
            if survive * share < config.suffix_decoding_min_token_prob:
                break
            survive *= share
            tokens.append(token)
            shares.append(share)
            score += survive
            node = child
        if score > best[2]:
            best = (tokens, shares, score)
    return best


class SuffixDrafter:
    """Suffix decoding in the decoding loop (see the module docstring).  Deterministic: q is
    one-hot on each drafted token, which speculative sampling handles exactly."""

    algorithm = "suffix"
    aux_layer_ids = None

    def __init__(
        self, num_speculative_tokens: int | None = None, config: SuffixConfig | None = None
    ) -> None:
        self.config = config or SuffixConfig()
        # vLLM's default K for suffix decoding is the tree depth.
        k = num_speculative_tokens or self.config.suffix_decoding_max_tree_depth
        self.num_speculative_tokens = k
        self.name = f"suffix-k{k}"
        self._earlier = SuffixTrie(self.config.suffix_decoding_max_tree_depth)
        self._outputs: deque[list[int]] = deque()
        self._seen: list[int] | None = None
        self.reset()

    @property
    def stored_settings(self) -> dict[str, Any]:
        return self.config.settings()

    def reset(self) -> None:
        """A new request: the last one's output joins the cache of earlier outputs."""
        seen = getattr(self, "_seen", None)
        if seen is not None and self._prompt_len is not None:
            self._remember_output(seen[self._prompt_len :])
        self._tree = SuffixTrie(self.config.suffix_decoding_max_tree_depth)
        self._seen = []
        self._prompt_len: int | None = None

    def _remember_output(self, output: list[int]) -> None:
        keep = self.config.suffix_decoding_max_cached_requests
        if keep == 0 or not output:
            return
        self._earlier.start_text()
        self._earlier.extend(output)
        self._outputs.append(output)
        while len(self._outputs) > keep:
            self._earlier.remove_text(self._outputs.popleft())

    def _sync(self, tokens: list[int]) -> None:
        """Bring the request's trie up to ``tokens`` (the engine only ever appends; anything else
        is a new text and rebuilds)."""
        seen = self._seen or []
        if len(tokens) < len(seen) or tokens[: len(seen)] != seen:
            self._tree = SuffixTrie(self.config.suffix_decoding_max_tree_depth)
            seen = []
        if self._prompt_len is None:
            self._prompt_len = len(tokens)
        self._tree.extend(tokens[len(seen) :])
        self._seen = list(tokens)

    def propose(self, ctx: DraftContext) -> Proposal:
        tokens = ctx.token_ids.tolist()
        self._sync(tokens)
        # The request's own suffixes are the trie's open nodes; those with children recur.
        own = [(m, n) for m, n in enumerate(self._tree.open) if m and n.children][::-1]
        matches = own + (self._earlier.matches(tokens) if self._outputs else [])
        draft, shares, _ = best_path(matches, self.num_speculative_tokens, self.config)
        return Proposal(token_ids=draft, confidences=shares or None)
