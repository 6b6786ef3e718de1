"""``python -m torch_tpu <command>``: tools for an install.

- ``doctor``: what this install runs on and whether it works (``--json`` for a machine-readable
  report); exit code 0 when healthy, 1 otherwise. See :mod:`torch_tpu.doctor`.

``python -m torch_tpu.ops`` lists the natively lowered ATen overloads.
"""

from __future__ import annotations

import argparse
import sys

from . import doctor


def parser() -> argparse.ArgumentParser:
    main_parser = argparse.ArgumentParser(prog="python -m torch_tpu", description=__doc__.split("\n")[0])
    commands = main_parser.add_subparsers(dest="command", metavar="command")
    doctor_parser = commands.add_parser(
        "doctor", help="report the platform, versions and cache, and self-test the device"
    )
    doctor.add_arguments(doctor_parser)
    doctor_parser.set_defaults(run=doctor.main)
    return main_parser


def main(argv: list[str] | None = None) -> int:
    main_parser = parser()
    args = main_parser.parse_args(argv)
    if args.command is None:
        main_parser.print_help()
        return 0
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
