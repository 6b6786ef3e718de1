"""Upstream TorchTPU's ``_internal.utils`` (hardware discovery)."""
