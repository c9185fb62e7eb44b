"""SpecUI on a real vLLM server: launch or attach (``server``), benchmark
speculators over HTTP and store the runs (``bench``), extract verifier hidden
states for training (``extract``, with the CPU-safe ``connector`` that runs
inside vLLM's own process).

vLLM lives in its own virtualenv (``.venv-vllm``, made by
``scripts/setup_vllm.sh``) and is only ever run as a subprocess, so nothing
here imports vllm -- except ``connector``, which vLLM imports.  Keep this file
free of imports: vLLM's workers import ``specui.vllm.connector`` through it.
"""
