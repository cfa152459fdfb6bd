"""Planning horizon and branch awareness (Ustaomeroglu, Askin et al., ICLR 2026): tasks, codes, MI analyses."""
from .tasks import (TASKS, ContextFreeGrammar, HorizonToy, PathFinding, PlanningExample, PlanningTask,
                    make_tokenizer, task_for, task_from_params, task_vocab)

__all__ = ["PlanningExample", "PlanningTask", "HorizonToy", "ContextFreeGrammar", "PathFinding", "TASKS",
           "make_tokenizer", "task_for", "task_from_params", "task_vocab"]
