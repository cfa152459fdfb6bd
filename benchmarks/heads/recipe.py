"""``interp reproduce heads``: inactive attention heads on SmolLM2-135M (full) or on a random Llama with planted
dead heads (quick): score functions and their flag rates, flagged-vs-random ablation on held-out text, the
paper's sweep (dynamic zeroing, AHON (LN) and AWFT against random heads) and the threshold-convention table."""
from __future__ import annotations

from functools import lru_cache

from interp.apps.reproduce import Outcome, Recipe
from interp.training import limit_threads

from .experiment import PLANTED, ValidationConfig, ValidationResult, build_planted_llama, scores, sweep, \
    threshold_comparison, validation


def _sweep_unit(score: str, metric: str) -> str:
    return f"sweep|{score}|{metric}"


def _stage_name(unit: str) -> str:
    return unit.replace("|", "-").replace(" ", "").replace("(", "").replace(")", "")


@lru_cache(maxsize=2)
def _load(model: str, backend: str):
    """One model per (spec or folder, backend) in this process: the units of a run share it."""
    import interp

    return interp.load(model, backend=backend)


class HeadsRecipe(Recipe):
    name = "heads"
    title = "Identifying and Evaluating Inactive Heads in Pretrained LLMs"
    method = "probes/heads/"
    doc = "docs/heads.md"
    notebook = "notebooks/inactive_heads.ipynb"
    Config = ValidationConfig
    presets = {
        # every stage and verdict on a random 4-layer Llama with 4 planted dead heads (of 16): seconds
        "quick": ValidationConfig(model=PLANTED, n_score_texts=12, n_eval_texts=6, eval_chars=120, max_length=48,
                                  fraction=0.25, n_random=3, sweep_fractions=(0.0, 0.1, 0.25),
                                  threshold_fractions=(0.1, 0.25)),
        # docs/heads.md (b) and (c): SmolLM2-135M, 48 scoring texts, 24 held-out chunks, p = 10 %
        "full": ValidationConfig(),
    }
    cost = {"quick": "about 6 CPU-seconds",
            "full": "about 10 CPU-minutes on one thread (SmolLM2-135M; 36 min wall on the loaded 2-core machine)"}
    code = ("interp.benchmarks.heads", "interp.probes.heads")

    def units(self, config: ValidationConfig) -> list:
        out = ["ablation"] + [_sweep_unit(s, m) for s, m in config.sweeps]
        return out + (["thresholds"] if config.threshold_fractions else [])

    def _model(self, config: ValidationConfig, stages):
        if config.model == PLANTED:
            folder = stages.path("planted-model", lambda d: build_planted_llama(d, config.seed))
            return _load(str(folder), config.backend)
        return _load(config.model, config.backend)

    def run_unit(self, config: ValidationConfig, unit: str, stages):
        import interp

        interp.set_progress(False)
        with limit_threads(config.threads, blas=False):
            if stages.done(_stage_name(unit)):  # stored: no model needed
                return stages(_stage_name(unit), lambda: None)
            model = self._model(config, stages)
            sc = stages("scores", lambda: scores(model, config))
            if unit == "ablation":
                return stages("ablation", lambda: validation(model, config, sc))
            if unit == "thresholds":
                given = sc if config.padded_queries == "drop" else None
                return stages("thresholds", lambda: threshold_comparison(model, config, head_scores=given)
                              .to_dict("records"))
            _, score, metric = unit.split("|")
            return stages(_stage_name(unit), lambda: sweep(model, config, sc, score, metric))

    def combine(self, config: ValidationConfig, outputs: list) -> Outcome:
        units = self.units(config)
        out = dict(zip(units, outputs))
        val: ValidationResult = out["ablation"]
        abl = val.ablation_result
        measured = {
            "ablation_delta": abl.delta, "random_delta": abl.random_delta,
            "ablation_minus_random_delta": abl.delta - abl.random_delta,
            "ablation_delta_relative": abl.delta / abl.baseline,
            "fraction_heads_flagged": [float(r["fraction_heads_flagged"]) for r in val.summary_rows],
            # the fixed set's share of the heads relative to the target fraction p, per score function
            "flagged_over_p": [float(r["fraction_heads_flagged"]) / config.fraction for r in val.summary_rows],
        }
        # (no '>' in a caption: the docs' record-table markers cannot hold one)
        tables = {f"fixed head sets per score function (p = {config.fraction:g}, flagged on more than "
                  f"{config.min_share:.0%} of the scoring texts)": val.summary_rows,
                  "flagged vs random heads, zero-ablated on held-out text": val.ablation_result.to_frame()
                  .to_dict("records")}
        figures = [("flagged vs random heads", val.figure())]
        from interp.probes.heads import SweepResult

        for s, m in config.sweeps:
            res = SweepResult(**out[_sweep_unit(s, m)])
            key = f"{_stage_name(s).lower()}_{m}"
            measured[f"percent_inactive_{key}"] = res.percent_inactive
            measured[f"percent_inactive_random_{key}"] = res.percent_inactive_random
            measured[f"percent_inactive_margin_{key}"] = res.percent_inactive - res.percent_inactive_random
            rand = [sum(r) / len(r) for r in res.random]
            sign = 1.0 if m == "accuracy" else -1.0  # positive: the score's zeroing hurts less than random heads
            measured[f"sweep_margin_{key}"] = [sign * (v - r) for p, v, r in zip(res.fractions, res.values, rand)
                                              if p > 0]
            tables[f"sweep: {s}, {m} (dynamic zeroing; random = as many random heads per input)"] = \
                res.to_frame().to_dict("records")
            figures.append((f"sweep: {s}, {m}", res.figure()))
        best = f"{_stage_name(config.score).lower()}_accuracy"
        if f"percent_inactive_{best}" in measured and "percent_inactive_awft_accuracy" in measured:
            measured["percent_inactive_best_minus_awft"] = (measured[f"percent_inactive_{best}"]
                                                            - measured["percent_inactive_awft_accuracy"])
        if "thresholds" in out:
            tables["threshold conventions and padding rules (official vs torch.quantile)"] = out["thresholds"]
        notes = (f"{config.model}: {abl.n_heads:g} heads flagged by {config.score} of {abl.total_heads}; "
                 f"held-out loss {abl.baseline:.4f}, delta {abl.delta:+.4f} against {abl.random_delta:+.4f} for "
                 f"{len(abl.random)} random sets of equal size. percent_inactive is in % of the target fraction p "
                 f"(the paper's metric: largest p within tolerance; accuracy = next-token top-1 accuracy within 1 "
                 f"point, loss = within +1 %).")
        return Outcome(measured=measured, tables=tables, figures=figures, notes=notes)


RECIPE = HeadsRecipe
