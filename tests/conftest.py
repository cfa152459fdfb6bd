"""Shared test setup: quiet progress bars, offline hub, deterministic torch."""
import os

os.environ.setdefault("INTERP_PROGRESS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite runs as two xdist workers on two cores: one thread each (also for notebook kernels, which
# inherit the environment) avoids oversubscription, which made 2-thread forwards ~10x slower here.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
torch.manual_seed(0)
