"""The target model (specui/verifier/): precisions, kernels, fast decoder, fingerprint."""
