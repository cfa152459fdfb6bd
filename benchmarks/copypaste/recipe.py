"""``interp reproduce copypaste``: CopyPasteLLM's preference construction and DPO on the digest's toy (a word-level
LM pre-trained on synthetic facts) and on SmolLM2-135M-Instruct with LoRA (counterfactual RAG prompts), each judged
on the digest's criteria: counterfactual faithfulness up 20 points, no drop on original contexts, κ up, the Alg. 3
contextual share up."""
from __future__ import annotations

from dataclasses import dataclass, field

from interp.models.copypaste import DPOConfig
from interp.apps.reproduce import Outcome, Recipe

from .smollm import SmolConfig, smollm_experiment
from .toy import ToyConfig, toy_experiment

UNITS = ("toy", "smollm")


@dataclass
class CopyPasteRunConfig:
    """``toy``: the digest's toy recipe; ``smollm``: the SmolLM2-135M LoRA-DPO run; ``units``: which of the two run."""

    toy: ToyConfig = field(default_factory=ToyConfig)
    smollm: SmolConfig = field(default_factory=SmolConfig)
    units: tuple[str, ...] = UNITS

    def __post_init__(self) -> None:
        bad = [u for u in self.units if u not in UNITS]
        if bad or not self.units:
            raise ValueError(f"units must be a non-empty subset of {UNITS}, got {self.units!r}")


def _changes(metrics: dict, prefix: str) -> dict:
    """``<prefix>_<metric>_before/_after/_change`` for the before/after metrics of a run."""
    out = {}
    for k, v in metrics.items():
        out[f"{prefix}_{k}_before"] = float(v["before"])
        out[f"{prefix}_{k}_after"] = float(v["after"])
        out[f"{prefix}_{k}_change"] = float(v["after"] - v["before"])
    return out


class CopyPasteRecipe(Recipe):
    name = "copypaste"
    title = "Copy-Paste to Mitigate Large Language Model Hallucinations"
    method = "models/copypaste/"
    doc = "docs/models/copypaste.md"
    notebook = "notebooks/copypaste.ipynb"
    Config = CopyPasteRunConfig
    presets = {
        # a 2-layer toy of 20 pre-training steps and a SmolLM2 run on 6 facts, 1 evaluation fact, 1 pair, one DPO
        # step: every stage and claim. Its cost is SmolLM2-135M's forward passes on one thread (generation,
        # Alg. 3 capture, DPO policy + reference), so the sizes that count are the prompts and pairs
        "quick": CopyPasteRunConfig(
            toy=ToyConfig(n_known=8, n_unknown=8, d_model=32, n_layers=2, n_heads=4, pretrain_steps=20,
                          pretrain_batch=16, n_dpo_samples=4, n_eval=2,
                          dpo=DPOConfig(lr=1e-3, epochs=1, batch_size=4, grad_accum=1, max_length=64)),
            smollm=SmolConfig(n_facts=6, n_eval=1, n_train_samples=2, n_pairs=1, max_new_tokens=8,
                              dpo=DPOConfig(lr=2e-4, batch_size=1, grad_accum=1, epochs=1, max_length=128))),
        # the documented runs: ToyConfig() (3,000 pre-training steps) and SmolConfig() (109 facts, 128 pairs,
        # 16 LoRA-DPO steps at lr 2e-4, stamp "{response} {answer}.")
        "full": CopyPasteRunConfig(),
    }
    cost = {"quick": "about 30 s on the loaded 2-core machine (one thread; loads zoo:smollm2-135m)",
            "full": "about 11 minutes on the loaded 2-core machine (8 CPU-minutes; one thread)"}
    code = ("interp.benchmarks.copypaste", "interp.models.copypaste", "interp.models.common")

    def units(self, config: CopyPasteRunConfig) -> list:
        return list(config.units)

    def run_unit(self, config: CopyPasteRunConfig, unit: str, stages):
        if unit == "toy":
            return {"unit": unit, "result": stages("toy", lambda: toy_experiment(config.toy))}
        res = smollm_experiment(config.smollm, stages=_Prefixed(stages, "smollm"), log=lambda *a: None)
        return {"unit": unit, "result": res}

    def combine(self, config: CopyPasteRunConfig, outputs: list) -> Outcome:
        measured: dict = {}
        tables: dict = {}
        figures = []
        for o in outputs:
            res = o["result"]
            measured.update(_changes(res.metrics, o["unit"]))
            tables[f"{o['unit']}: before and after DPO"] = [
                {"metric": k, "before": v["before"], "after": v["after"]} for k, v in res.metrics.items()]
            figures.append((f"{o['unit']}: before and after DPO", res.figure()))
            if o["unit"] == "smollm":
                measured["smollm_known_facts"] = float(res.n_known)
                measured["smollm_dpo_loss_last"] = float(res.dpo_loss[-1])
                tables["smollm: example answers (question, before, after)"] = [
                    {"question": q, "before": b, "after": a} for q, b, a in res.examples]
        return Outcome(measured=measured, tables=tables, figures=figures,
                       notes="The toy is a 64-d word-level Llama pre-trained from scratch; SmolLM2-135M-Instruct is "
                             "trained with LoRA on 128 pairs (16 steps) against the paper's 7-8B models on ~1,800.")


class _Prefixed:
    """A view of a :class:`interp.stages.Stages` whose stage names carry a prefix (``smollm-known``, ...)."""

    def __init__(self, stages, prefix: str) -> None:
        self._stages, self._prefix = stages, prefix

    def __call__(self, name: str, fn):
        return self._stages(f"{self._prefix}-{name}", fn)

    @property
    def folder(self):
        return self._stages.folder

    @property
    def fresh(self) -> bool:
        return self._stages.fresh


RECIPE = CopyPasteRecipe
