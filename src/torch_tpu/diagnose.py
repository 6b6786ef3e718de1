"""``python -m torch_tpu.diagnose [--html PATH] [--no-profile] script.py [args]``: run
``script.py`` as ``__main__`` (with ``sys.argv`` set to ``[script.py, args...]``) inside
:func:`torch_tpu.diagnose`, print the report to stderr (``--html``: also write it as an HTML
page with plots), and exit with the script's exit code. ``--no-profile``: no torch.profiler
session for the device's side (for a script that runs its own profiler).

In Python code, ``torch_tpu.diagnose()`` is the context manager
(:class:`torch_tpu.diagnosis.diagnose`); should this module be imported as
``torch_tpu.diagnose``, calling it makes the context manager all the same.
"""

from __future__ import annotations

import os
import runpy
import sys
import types

USAGE = "usage: python -m torch_tpu.diagnose [--html PATH] [--no-profile] script.py [args...]"


def main(argv: list[str] | None = None) -> int:
    """Run the script named in ``argv`` (after the options) inside a diagnosis; its exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    html, profile = None, True
    while argv and argv[0] in ("--html", "--no-profile"):
        option = argv.pop(0)
        if option == "--no-profile":
            profile = False
        elif argv:
            html = argv.pop(0)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 0 if argv else 2
    from torch_tpu.diagnosis import diagnose

    script = argv[0]
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # (as ``python script.py`` does)
    with diagnose(profile=profile) as report:
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as done:
            code = _exit_code(done)
        else:
            code = 0
    if html:
        report.save_html(html)
        print(f"torch_tpu diagnosis: HTML report in {html}", file=sys.stderr)
    return code


def _exit_code(done: SystemExit) -> int:
    if done.code is None or isinstance(done.code, int):
        return done.code or 0
    print(done.code, file=sys.stderr)  # (``sys.exit("message")``)
    return 1


class _CallableModule(types.ModuleType):
    def __call__(self, **options):
        from torch_tpu.diagnosis import diagnose

        return diagnose(**options)


if __name__ == "__main__":
    sys.exit(main())
else:
    sys.modules[__name__].__class__ = _CallableModule
