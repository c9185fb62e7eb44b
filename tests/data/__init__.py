"""Prompt sets, the corpus, self-distillation and hidden states (specui/data/)."""
