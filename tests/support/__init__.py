"""Helpers the tests share (no tests here; fixtures stay in tests/conftest.py).  A test module
imports only from here, never from another test module.

- ``paths``: ``REPO`` and ``FIXTURES`` (the speculators 0.9.0 reference set).
- ``verifiers``: ``make_tiny_verifier``, a small random Llama verifier.
- ``families``: the registered algorithms of the DFlash and EAGLE-3 families.
- ``vllm_skip``: ``needs_vllm``, the skip mark of the real-vLLM tests; ``vllm_servers``:
  ``launch``, a real vLLM server a module's fixture stops.
- ``cli_errors``: ``cli`` (``specui`` in-process) and ``assert_one_error``.
- ``store_helpers``, ``store_history``, ``replay_helpers``: hand-built traces and runs, an old
  store's schema, vLLM-style stored runs.
- ``scripted_drafters``: drafters that propose fixed or random blocks.
- ``app_server``, ``load_driver``: a real ``python app.py`` and sessions against it.
- Processes the tests start: ``store_writer`` and ``kill_points`` (``python -m``),
  ``ddp_train`` (``torchrun``).
"""
