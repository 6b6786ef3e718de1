#!/usr/bin/env bash
# TorchRec next to torch 2.13.0, into the environment of the python that runs it (a virtual
# environment of its own is advised; docs/ecosystem.md). Usage:
#   python -m venv --system-site-packages .venv-rec && PYTHON=.venv-rec/bin/python scripts/install_rec.sh
set -euo pipefail
PYTHON=${PYTHON:-python}
# fbgemm's CPU build: 1.9.0 fails to load against torch 2.13 (an undefined autograd symbol), 1.8.0
# loads. torchrec's other requirements as it lists them; torch stays 2.13.0.
"$PYTHON" -m pip install -q "torch==2.13.0" "fbgemm-gpu-cpu==1.8.0" "tensordict==0.15.3" \
    "torchmetrics==1.0.3" tqdm pyre-extensions
# torchrec requires "fbgemm-gpu", the CUDA build, which would replace the CPU one: installed
# without its requirements, which the line above provides
"$PYTHON" -m pip install -q --no-deps "torchrec==1.9.2"
