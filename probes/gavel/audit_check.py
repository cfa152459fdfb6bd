"""GAVEL as an ``interp audit`` check: ``interp audit --checks gavel --set gavel.rules=FILE``.

Runs a rule file over a labelled conversation set and reports, per rule, AUC (continuous rule score),
balanced accuracy, TPR and FPR (overall, hard and random negatives) and, per CE, detection AUC and rate,
with plotly figures. The audit's own texts are scored as harmless assistant turns: any rule firing on them
is a false positive (reported as ``fpr_audit_texts``).

Inputs (config):

- ``rules``: a rule file (JSON/YAML, :func:`~interp.probes.gavel.load_rules`); required.
- ``library``: a saved :class:`~interp.probes.gavel.CELibrary` whose detector was trained on this model.
  Without it the check trains the built-in template library's detector on the model first (small sizes,
  ``train_per_ce`` texts per CE).
- ``conversations``: a JSON file ``{"conversations": [{"messages": [...], "ces": [...]}, ...]}`` (a
  conversation's label for a rule is whether its CEs satisfy it; ``"labels": {rule: bool}`` overrides).
  Without it the built-in template scenarios' held-out conversations are used.
"""
from __future__ import annotations

import html
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from interp.checks import AuditData, Check, Rendered
from interp.results import Result

from . import library as lib
from .ce import CELibrary
from .evaluation import gavel_rule_outputs, rule_metrics, template_detector
from .features import FeatureSpec, conversation_features
from .rules import load_rules

__all__ = ["GavelConfig", "GavelCheck", "GavelAuditResult"]


@dataclass
class GavelConfig:
    """Options of the ``gavel`` check."""

    rules: str = ""  #: rule file (required)
    library: str = ""  #: saved CE library (detector + calibration) for this model; empty: train the template one
    conversations: str = ""  #: labelled conversations (JSON); empty: the built-in held-out scenario set
    layers: str = ""  #: "start:stop" readout layers when training (default: the middle ~45 % of the model)
    train_per_ce: int = 12
    n_test: int = 10  #: built-in set: conversations per scenario and kind
    max_audit_texts: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("train_per_ce", "n_test", "max_audit_texts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"gavel.{name} must be a positive integer, got {v!r}")
        if self.layers and (self.layers.count(":") != 1 or not all(p.strip().isdigit() for p in self.layers.split(":"))):
            raise ValueError(f"gavel.layers must look like 'start:stop' (e.g. 6:15), got {self.layers!r}")


@dataclass
class GavelAuditResult(Result):
    """Per-rule and per-CE metrics of a rule file on a conversation set."""

    #: the type name its saved files record (the module moved in #45; files written before load and compare equal)
    saved_type = "interp.probes.gavel.audit.GavelAuditResult"

    rules: list[dict]
    ces: list[dict]
    rule_text: dict
    n_conversations: int
    source: str

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.rules)

    def figure(self):
        import plotly.express as px
        df = self.to_frame()
        cols = [c for c in df.columns if c in ("auc", "balanced_accuracy", "fpr", "fpr_hard", "fpr_audit_texts")]
        long = df.melt(id_vars=["rule"], value_vars=cols, var_name="metric")
        return px.bar(long, x="rule", y="value", color="metric", barmode="group", title="GAVEL rules")

    def ce_figure(self):
        import pandas as pd
        import plotly.express as px
        return px.bar(pd.DataFrame(self.ces), x="ce", y=["auc", "detection_rate", "false_alarm_rate"],
                      barmode="group", title="GAVEL CE detection")


def _default_layers(model) -> tuple[int, int]:
    n = model.cfg.n_layers
    return (max(0, int(0.2 * n)), max(1, int(0.5 * n)))


class GavelCheck(Check):
    name: ClassVar[str] = "gavel"
    title: ClassVar[str] = "GAVEL rule-based activation monitoring"
    description: ClassVar[str] = ("Runs a rule file over labelled conversations with cognitive-element detectors on "
                                  "attention readouts (GAVEL, ICLR 2026); per-rule AUC/balanced accuracy/FPR, per-CE "
                                  "detection.")
    Config: ClassVar[type] = GavelConfig
    #: needs a rule file (--set gavel.rules=FILE): runs when named, not in the default audit (opt-in)
    opt_in: ClassVar[bool] = True
    METRICS: ClassVar[dict[str, str]] = {"rules": "rules evaluated", "mean_auc": "mean per-rule AUC",
                                         "mean_fpr": "mean per-rule false-positive rate",
                                         "mean_fpr_audit_texts": "mean share of the audit texts a rule fires on"}

    def missing(self) -> str | None:
        """Without a rule file there is nothing to run (``--checks all`` skips it; naming it is an input error)."""
        return None if self.config.rules else "needs a rule file: --set gavel.rules=FILE"

    def applies(self, model) -> str | None:
        if model.cfg.modality != "text" or model.tokenizer is None:
            return "GAVEL reads conversations: it needs a text model with a tokenizer"
        return None

    def metrics(self, result: GavelAuditResult) -> dict:
        s = self.summary(result)
        return {k: s.get(k) for k in self.METRICS}

    def run(self, model, data: AuditData) -> GavelAuditResult:
        cfg: GavelConfig = self.config
        if not cfg.rules:
            raise ValueError("the gavel check needs a rule file: --set gavel.rules=FILE")
        if cfg.library:
            det = CELibrary.load(cfg.library).detector
            if det is None:
                raise ValueError(f"CE library {cfg.library} has no trained detector")
            det.spec.check(model)
        else:
            a, b = (int(x) for x in cfg.layers.split(":")) if cfg.layers else _default_layers(model)
            det = template_detector(model, FeatureSpec.range(a, b), cfg.train_per_ce, cfg.seed)
        rules = load_rules(cfg.rules, known_ces=det.ces)
        if cfg.conversations:
            path = Path(cfg.conversations)
            if not path.is_file():
                raise ValueError(f"gavel.conversations: {path} does not exist")
            obj = json.loads(path.read_text())
            convs = obj["conversations"] if isinstance(obj, dict) else obj
            source = str(path)
        else:
            rng = random.Random(f"gavel-audit/test/{cfg.seed}")
            convs = []
            for r in lib.library_rules(include_unseen=True):
                convs += [{"messages": c.messages, "ces": c.ces}
                          for c in lib.scenario_conversations(rng, r, cfg.n_test, cfg.n_test, "test", list(lib.CE_TEMPLATES))]
            convs += [{"messages": c.messages, "ces": c.ces}
                      for c in lib.neutral_conversations(rng, cfg.n_test, "test", list(lib.CE_TEMPLATES))]
            source = "built-in template scenarios (held-out templates)"
        for i, c in enumerate(convs):
            if not isinstance(c, dict) or "messages" not in c or ("ces" not in c and "labels" not in c):
                raise ValueError(f"conversation {i} needs 'messages' and 'ces' (or 'labels')")
        probs = det.sequence_probs(*conversation_features(model, [c["messages"] for c in convs], det.spec,
                                                          return_runs=True))
        audit = [[{"role": "user", "content": "Tell me something."}, {"role": "assistant", "content": t}]
                 for t in data.texts[: cfg.max_audit_texts]]
        audit_probs = det.sequence_probs(*conversation_features(model, audit, det.spec, return_runs=True))
        rows = []
        for r in rules:
            y = np.array([c["labels"][r.name] if "labels" in c and r.name in c["labels"] else r.evaluate(c["ces"])
                          for c in convs], dtype=bool)
            group = ["positive" if yy else ("hard" if set(c.get("ces", [])) & set(r.condition_ces) else "random")
                     for yy, c in zip(y, convs)]
            dec, sc = gavel_rule_outputs(det, r, probs)
            row = {"rule": r.name, "n_positive": int(y.sum()), "n_negative": int((~y).sum())}
            if y.any() and not y.all():
                row.update(rule_metrics(y, dec, sc, group))
            adec, _ = gavel_rule_outputs(det, r, audit_probs)
            row["fpr_audit_texts"] = float(adec.mean())
            rows.append(row)
        ce_rows = []
        from sklearn.metrics import roc_auc_score
        for ce in det.ces:
            if not all("ces" in c for c in convs):
                break
            y = np.array([ce in c["ces"] for c in convs])
            s = np.array([float(p[:, det.index(ce)].max()) for p in probs])
            f = np.array([ce in det.fired(p) for p in probs])
            ce_rows.append({"ce": ce, "auc": float(roc_auc_score(y, s)) if y.any() and not y.all() else float("nan"),
                            "detection_rate": float(f[y].mean()) if y.any() else float("nan"),
                            "false_alarm_rate": float(f[~y].mean()) if (~y).any() else float("nan"),
                            "threshold": float(det.thresholds[det.index(ce)]),
                            "patience": int(det.patience[det.index(ce)])})
        return GavelAuditResult(rows, ce_rows, {r.name: r.render() for r in rules}, len(convs), source)

    def render(self, result: GavelAuditResult) -> Rendered:
        import pandas as pd
        items = "".join(f"<li><b>{html.escape(k)}</b>: <code>{html.escape(v)}</code></li>"
                        for k, v in result.rule_text.items())
        text = (f"<p>{result.n_conversations} conversations ({html.escape(result.source)}).</p><ul>{items}</ul>")
        figs = [("Per-rule metrics", result.figure())]
        tables = [("Rules", result.to_frame())]
        if result.ces:
            figs.append(("Per-CE detection", result.ce_figure()))
            tables.append(("CEs", pd.DataFrame(result.ces)))
        return Rendered(html=text, figures=figs, tables=tables)

    def summary(self, result: GavelAuditResult) -> dict:
        df = result.to_frame()
        out = {"rules": len(df)}
        for k in ("auc", "fpr", "fpr_audit_texts"):
            if k in df:
                out[f"mean_{k}"] = float(df[k].mean())
        return out
