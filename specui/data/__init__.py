"""Training and evaluation data: prompt sets, self-distilled responses, verifier hidden states."""

from specui.data.prompts import (
    Prompt,
    PromptSet,
    bench_split,
    load_prompts,
    prompt_sets,
    read_prompt_file,
    register_prompt_set,
    split_of,
    training_prompt_sets,
)

__all__ = [
    "Prompt",
    "PromptSet",
    "bench_split",
    "load_prompts",
    "prompt_sets",
    "training_prompt_sets",
    "read_prompt_file",
    "register_prompt_set",
    "split_of",
]
