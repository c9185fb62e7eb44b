"""The columns of a comparison and of a steps export: each carries its label, definition
and unit, so the dashboard, the CLI and the CSV say what a number means.

* Acceptance metrics (tau, a_k, acceptance rate) use every stored step of the run
  (``specui.acceptance``).
* Throughput and speedup use the prompts whose generation finished
  (``specui.metrics.comparison``).
"""

from __future__ import annotations

from dataclasses import dataclass

from specui.metrics.calibration import BOOTSTRAP_RESAMPLES, INTERVAL_LEVEL


@dataclass(frozen=True)
class Column:
    """One number (or text) of a row, with what it means."""

    key: str  # the CSV header: stable snake_case
    label: str  # what the UI shows
    definition: str
    unit: str = ""
    kind: str = "float"  # float | int | text


_CI_DEFINITION = (
    f"Bound of the {INTERVAL_LEVEL:.0%} bootstrap interval of {{what}} over prompts "
    f"({BOOTSTRAP_RESAMPLES} resamples of the prompts, percentile method; blank under 2 prompts)"
)

# A table, one column a line: the formatter leaves it as written.
# fmt: off
BASE_COLUMNS: list[Column] = [
    Column("run_id", "Run", "Id of the run in the store", "", "int"),
    Column("label", "Label", "Name of the run (its drafter when not named)", "", "text"),
    Column("algorithm", "Algorithm",
           "Drafting algorithm; none = baseline without a drafter", "", "text"),
    Column("drafter", "Drafter", "Drafter (speculator) name", "", "text"),
    Column("verifier", "Verifier", "Target model that verifies the drafts", "", "text"),
    Column("verifier_fingerprint", "Verifier weights",
           "Fingerprint of the verifier's weights (specui.verifier.fingerprint.model_fingerprint; "
           "the table shows its first 8 hex digits): two weight sets of one name are two "
           "verifiers. Empty = unknown (runs before it, or a vLLM server whose model is not a "
           "local folder)", "", "text"),
    Column("backend", "Backend",
           "local = SpecUI's decoding loop; vllm = a vLLM server", "", "text"),
    Column("prompt_set", "Prompt set", "Prompts the run generated from", "", "text"),
    Column("status", "Status",
           "running, done, stopped, failed or incomplete (process died)", "", "text"),
    Column("num_speculative_tokens", "K",
           "Most draft tokens proposed per step (run settings)", "tokens", "int"),
    Column("temperature", "Temperature", "Sampling temperature (0 = greedy)", ""),
    Column("verifier_precision", "Verifier precision",
           "fp32, or bf16: bf16 matmuls with batch-invariant kernels "
           "(specui.verifier.batch_invariant); empty for runs before it", "", "text"),
    Column("num_prompts", "Prompts", "Prompts whose generation finished", "prompts", "int"),
    Column("num_output_tokens", "Output tokens",
           "Tokens generated, over finished prompts", "tokens", "int"),
    Column("wall_time_s", "Wall time", "Generation wall time summed over finished prompts", "s"),
    Column("num_steps", "Steps", "Decoding steps stored (one verifier pass each)", "steps", "int"),
    Column("num_drafts", "Drafts", "Steps that drafted at least one token", "steps", "int"),
    Column("num_drafted_tokens", "Drafted tokens",
           "Draft tokens proposed, over all steps", "tokens", "int"),
    Column("num_accepted_tokens", "Accepted tokens",
           "Draft tokens the verifier accepted, over all steps", "tokens", "int"),
    Column("acceptance_length", "τ (acceptance length)",
           "1 + accepted draft tokens / drafts (the 1 is the verifier's bonus token): the tokens a "
           "step that drafted commits. vLLM's \"mean acceptance length\" is this one. A drafter "
           "that drafts at only some steps (n-gram lookup) has a τ above its tokens per step",
           "tokens/step"),
    Column("acceptance_length_ci_low", "τ 95% CI low",
           _CI_DEFINITION.format(what="τ"), "tokens/step"),
    Column("acceptance_length_ci_high", "τ 95% CI high",
           _CI_DEFINITION.format(what="τ"), "tokens/step"),
    Column("tokens_per_step", "Tokens per step",
           "Output tokens / verifier steps, the steps that drafted nothing included: what a "
           "verifier pass yields. Equals τ when every step drafts (learned drafters); compare "
           "this one across drafters. Spec-Bench's \"mean accepted tokens\" is this one",
           "tokens/step"),
    Column("draft_acceptance_rate", "Draft acceptance rate",
           "Accepted draft tokens / drafted tokens", "fraction"),
    Column("tokens_per_s", "Throughput",
           "Output tokens / wall time, over finished prompts", "tokens/s"),
    Column("ms_per_output_token", "Time per output token",
           "Wall time / output tokens, over finished prompts", "ms/token"),
    Column(
        "speedup",
        "Speedup",
        "Baseline time per output token / this run's time per output token, over the prompts "
        "both finished (baseline: no drafter, same backend, prompt set, verifier and verifier "
        "weights)",
        "x",
    ),
    Column("speedup_ci_low", "Speedup 95% CI low",
           _CI_DEFINITION.format(what="speedup") + ", paired with the baseline's", "x"),
    Column("speedup_ci_high", "Speedup 95% CI high",
           _CI_DEFINITION.format(what="speedup") + ", paired with the baseline's", "x"),
    Column("baseline_run_id", "Baseline run", "Run the speedup is measured against", "", "int"),
    Column("draft_time_s", "Draft time", "Time spent drafting, summed over stored steps", "s"),
    Column("verify_time_s", "Verify time", "Time spent verifying, summed over stored steps", "s"),
    Column(
        "confidence_ece",
        "Confidence ECE",
        "Expected calibration error of per-slot confidences (10 equal-width bins); slot k is "
        "accepted iff k < tokens accepted",
        "fraction",
    ),
    Column("confidence_auroc", "Confidence AUROC",
           "Chance an accepted slot has a higher confidence than a rejected one", "fraction"),
    Column("confidence_brier", "Confidence Brier",
           "Mean of (confidence - accepted)^2 over slots", "fraction"),
    Column(
        "confidence_auroc_slot_index",
        "AUROC of the slot index alone",
        "Confidence AUROC's baseline: the same slots scored by their slot's acceptance rate "
        "(a head must beat it)",
        "fraction",
    ),
]
# fmt: on


def position_column(k: int) -> Column:
    """The a_k column (k = 1..K): a comparison has as many as its longest draft."""
    return Column(
        f"acceptance_pos_{k}", f"a_{k}", f"Drafts whose slot {k} was accepted / drafts", "fraction"
    )


# A table, one column a line: the formatter leaves it as written.
# fmt: off
STEP_COLUMNS: list[Column] = [
    Column("run_id", "Run", "Id of the run in the store", "", "int"),
    Column("prompt_index", "Prompt", "Index of the prompt in the prompt set", "", "int"),
    Column("step", "Step", "Step number within the prompt's generation", "", "int"),
    Column("context_len", "Context",
           "Committed tokens (prompt + generated) before the step", "tokens", "int"),
    Column("num_drafted", "Drafted", "Draft tokens proposed", "tokens", "int"),
    Column("num_accepted", "Accepted", "Draft tokens accepted", "tokens", "int"),
    Column("draft_token_ids", "Draft ids", "Drafted token ids (JSON list)", "", "text"),
    Column("draft_texts", "Draft texts", "Drafted token texts (JSON list)", "", "text"),
    Column("draft_probs", "q(draft)",
           "Drafter probability of each drafted token (JSON list)", "", "text"),
    Column("target_probs", "p(draft)",
           "Verifier probability of each drafted token (JSON list)", "", "text"),
    Column("confidences", "Confidences",
           "Confidence-head estimate per slot (JSON list), empty without a head", "", "text"),
    Column("final_token_id", "Final id", "The verifier's own token closing the step", "", "int"),
    Column("final_token_text", "Final text", "Text of the final token", "", "text"),
    Column("final_token_kind", "Final kind",
           "bonus (all drafts accepted) or corrected (replaces the first rejected draft)",
           "", "text"),
    Column("emitted_token_ids", "Emitted ids", "Tokens the step committed (JSON list)", "", "text"),
    Column("draft_time_s", "Draft time", "Time spent drafting", "s"),
    Column("verify_time_s", "Verify time", "Time spent verifying", "s"),
]
# fmt: on
