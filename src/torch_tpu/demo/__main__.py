"""``python -m torch_tpu.demo``: see :mod:`torch_tpu.demo`."""

import sys

from . import main

sys.exit(main())
