"""Helpers for checking torch_tpu against PyTorch CPU (used by the tests, benchmarks and docs)."""
