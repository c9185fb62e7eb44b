"""SpecUI against a real vLLM server (specui/vllm/)."""
