"""The libraries around PyTorch (Diffusers, PEFT, TRL, timm) run offline: nothing may reach the
hub; every model is built from a config with random weights."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
