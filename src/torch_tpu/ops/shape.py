"""shape lowerings."""
from __future__ import annotations
