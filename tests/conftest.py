"""Shared test setup: quiet progress bars, offline hub, deterministic torch."""
import os

os.environ.setdefault("INTERP_PROGRESS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.manual_seed(0)
