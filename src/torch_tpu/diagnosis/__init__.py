"""``torch_tpu.diagnose``: what a block of code made torch_tpu do, with the user's lines and
hints on what to change (docs/profiling.md, "Diagnosis").

The pieces: :mod:`.collector` (the context manager and its hooks), :mod:`.report` (the
:class:`Report` record and its text), :mod:`.hints` (the rules, as data). Two ways in:

- ``with torch_tpu.diagnose() as report: ...``: ``torch_tpu.diagnose`` is
  :class:`~.collector.diagnose`, reached through ``torch_tpu``'s lazy attributes (importing
  torch_tpu imports none of this);
- ``python -m torch_tpu.diagnose script.py [args]``: the module ``torch_tpu/diagnose.py`` runs
  the script inside it. (A package named ``diagnose`` would shadow the context manager as the
  attribute ``torch_tpu.diagnose`` once imported, so the code lives here and that module only
  holds the command line.)
"""

from __future__ import annotations

from .collector import diagnose
from .report import Report, Site

__all__ = ["diagnose", "Report", "Site"]
