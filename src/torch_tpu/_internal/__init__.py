"""Upstream TorchTPU's internal module paths that other projects import (Helion's Pallas
launcher): ``_internal.pallas`` and ``_internal.utils.hardware``."""
