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


# Long work first, so that the two xdist workers share it and the run does not end with one worker busy and the
# other out of tests (xdist hands the first quarter of the items out alternately, the rest in chunks as workers
# free up). The two cold zoo builds come first, one per worker, so neither waits on the other's build lock
# (zoo:toy-grammar's ~90 s build used to come near the end of the run); then the notebooks and the reproduction
# recipes. Everything else keeps its collection order (the sort is stable).
_COLD_BUILDS = ("tests/zoo/test_grammar.py::test_toy_grammar_model",
                "tests/steering/test_repit_toy.py::test_toy_model_learned_the_rule")
_LONG_MODULES = ("tests/test_notebooks.py", "tests/reproduce/test_recipes.py")


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        if item.nodeid in _COLD_BUILDS:
            return 0
        return 1 if item.nodeid.split("::")[0] in _LONG_MODULES else 2

    items.sort(key=rank)
