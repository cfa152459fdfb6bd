"""Steering as an ``interp audit`` check: any registered steering method on refusal or on a contrastive behaviour.

Which evaluation runs by default (``behaviour="auto"``): **refusal** when the model has refusal behaviour to
steer (a chat template and at least ``min_baseline_refusal`` of a harmful probe refused, see below), otherwise the
built-in behaviour ``default_behaviour`` (``sentiment``), which a language model exhibits without being asked:
SmolLM2-135M-Instruct, the default model, continues 11 of the 12 neutral evaluation prompts ("The hotel room turned
out to be") positively by the marker judge (rate 0.92), and a linear probe separates the contrastive texts (held-out
accuracy 1.0); on ``uppercase`` its unsteered rate is near 0, so there would be nothing to remove. The check then
fits ``behaviour_method`` (``diff_in_means``) in place of a method that needs harm categories (RepIt) and steers
*against* the behaviour (``scale=-1``, unless set): on SmolLM2 the behaviour rate falls 0.92 -> 0.00 at layer 15.
``--set steering.behaviour=refusal`` forces the refusal evaluation (skipped, with the reason, where it does not apply).

Two evaluations, both through the steering-method interface only (:class:`~interp.steering.base.SteeringMethod`:
``check_options``, ``for_audit``, ``audit_fit``, ``needs_categories``, ``audit_title``), so a plug-in method runs
here as the built-ins do:

* **refusal** (RepIt: Siu et al., ICLR 2026, by default; what follows);
* **behaviour** (any method that needs no harm categories): the method is fitted on a contrastive behaviour set (a
  built-in one, ``--set steering.behaviour=sentiment``, or a user's JSON file, ``--set steering.data=FILE``) and
  :func:`interp.steering.behaviour.evaluate_behaviour` reports the behaviour rate (marker judge) and a linear
  probe's score before and after steering, the KL on neutral text (the audit's text set) and the perplexity of
  the steered greedy continuation under the unsteered model.

``--set steering.<option>=VALUE`` sets a field of this check's config or, for any other name, a field of the
selected method's config (``steering.method`` chooses it; RepIt's ``targets``, ``rho``, ``candidate_layers``,
``nontarget_retain``, ``intervention`` ... are its own options); a name in both (``layer``, ``position``,
``batch_size``) sets both. The method's options are passed to it as given; the method refuses those it cannot
take (:meth:`SteeringMethod.check_options`). An unknown method or option is a ``ValueError`` from
:meth:`SteeringCheckConfig.from_overrides`, raised before any model loads.

Refusal evaluation: ``interp audit MODEL --checks steering`` adds a steering section when the model has a refusal data set:
it builds the method (``for_audit``: default ``repit``, targets bio/chem/nuclear, with RepIt's audit sizes) and
fits it (``audit_fit``) on the ``train`` split of :mod:`interp.data`, selecting on ``val``, and reports on held-out
``test`` prompts the method, the layer, and the refusal table per category (string-match judge on greedy
generations) without the intervention, with the method's baselines (RepIt: ``natural``, its target vector before
isolation) and with the method's vector, plus the harmless-prompt KL divergence.

"Has a refusal data set" (``applicable="auto"``): the tokenizer has a chat template, the data set formats
with it, and the model refuses at least ``min_baseline_refusal`` of a probe of harmful ``val`` prompts
(first-token refusal log-odds > 0). Otherwise the section says why it was skipped (``applicable="yes"``
forces the run, ``"no"`` always skips).
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from interp.checks import AuditData, Check, Rendered, parse_overrides
from interp.results import Result
from interp.viz import token_view

from .base import SteeringData, SteeringMethod, get, has_chat_template
from .behaviour import KL_VIEW_TITLE, evaluate_behaviour
from .refusal import evaluate_refusal, refusal_data, refusal_scores, refusal_token_ids


@dataclass
class SteeringCheckConfig:
    """Options of the ``steering`` check (reduced sizes, so an audit stays minutes on CPU)."""

    method: str = "repit"  #: a name from steering.available()
    applicable: str = "auto"  #: "auto" | "yes" | "no"
    min_baseline_refusal: float = 0.5  #: auto: share of harmful val probes the model must refuse (log-odds > 0)
    probe_prompts: int = 22  #: harmful val prompts of the applicability probe (spread over categories)
    train_per_category: int = 16
    train_harmless: int = 64
    val_per_category: int = 6
    test_per_category: int = 6
    test_harmless: int = 24
    max_new_tokens: int = 24
    layer: int | None = None  #: fix the layer (RepIt: skips the selection when position is also set)
    position: int | None = None
    batch_size: int = 16
    #: "auto": refusal when the model has refusal behaviour, else ``default_behaviour``; "refusal"; or a
    #: built-in behaviour (interp.data.behaviour_names())
    behaviour: str = "auto"
    #: the built-in behaviour "auto" falls back to: one the model exhibits unsteered (see the module docstring)
    default_behaviour: str = "sentiment"
    #: the method fitted on a behaviour in place of a ``method`` that needs harm categories (RepIt)
    behaviour_method: str = "diff_in_means"
    #: the scale of the auto fallback's vector when the method has a ``scale`` and it is not set: -1 steers
    #: against the behaviour the model exhibits
    behaviour_scale: float = -1.0
    data: str | None = None  #: a JSON contrastive set (interp.data.load_behaviour); overrides behaviour
    probe_layer: int | None = None  #: behaviour probe layer (default: the vector's layer)
    neutral_texts: int = 16  #: audit texts the neutral-text KL runs on
    #: fields of the method's own config (RepIt: targets, rho, candidate_layers, nontarget_retain, intervention, ...),
    #: passed to the method as given
    method_options: dict = field(default_factory=dict)

    # method-config fields that the check's own fields of the same name also set
    SHARED: ClassVar[tuple[str, ...]] = ("layer", "position", "batch_size")

    def __post_init__(self) -> None:
        self.validate()  # a config that exists is valid: the audit parses and checks it once, before any model loads

    @classmethod
    def from_overrides(cls, overrides: dict[str, str]) -> "SteeringCheckConfig":
        """Build from ``--set steering.X=V`` strings: X a field of this config or of the method's config. The
        strings are parsed once, into the typed config the check runs with (validated as it is built).

        Raises ``ValueError`` (before any model loads) for an unknown method, an option neither config has, a
        value that does not parse, an unknown behaviour, an unreadable data file or repit on a non-refusal set.
        """
        own = {f.name for f in fields(cls)} - {"method_options"}
        kwargs = parse_overrides(cls, {k: v for k, v in overrides.items() if k in own}, "check 'steering'", "steering")
        rest = {k: v for k, v in overrides.items() if k not in own}
        method = kwargs.get("method", cls.method)
        if rest:
            method_cls = _method_class(method)
            opts = method_cls.option_names()
            bad = sorted(set(rest) - set(opts))
            if bad:
                raise ValueError(f"check 'steering' has no option {bad[0]!r}: it is neither a field of the check "
                                 f"({', '.join(sorted(own))}) nor of method {method!r}'s config "
                                 f"({', '.join(opts) or 'it takes no options'})")
            kwargs["method_options"] = parse_overrides(method_cls.config_class, rest, f"method {method!r}", "steering")
        return cls(**kwargs)

    def method_class(self) -> type[SteeringMethod]:
        """The registered class of :attr:`method` (``ValueError`` naming the available methods otherwise)."""
        return _method_class(self.method)

    def method_kwargs(self) -> dict[str, Any]:
        """The method's config overrides: the shared fields this config sets (not ``None``) that the method's
        config has, then :attr:`method_options`."""
        return {**self._shared(self.method_class()), **self.method_options}

    def _shared(self, method_cls: type[SteeringMethod]) -> dict[str, Any]:
        """The shared fields this config sets (not ``None``) that ``method_cls``'s config has."""
        opts = method_cls.option_names()
        return {k: getattr(self, k) for k in self.SHARED if k in opts and getattr(self, k) is not None}

    def evaluation(self) -> str:
        """``"refusal"``, ``"data"`` (the JSON file), a built-in behaviour name, or ``"auto"`` (decided on the model).

        With ``behaviour="auto"`` a method that needs harm categories (RepIt) asks for ``"refusal"`` and any other
        method for ``"auto"``; either way a model without refusal behaviour is evaluated on
        :attr:`default_behaviour` instead (:meth:`falls_back`)."""
        if self.data is not None:
            return "data"
        if self.behaviour == "auto" and self.method_class().needs_categories:
            return "refusal"
        return self.behaviour

    @property
    def falls_back(self) -> bool:
        """Whether a model without refusal behaviour is evaluated on :attr:`default_behaviour` (``behaviour="auto"``,
        no data file) rather than skipped (``behaviour="refusal"``)."""
        return self.behaviour == "auto" and self.data is None

    def behaviour_method_class(self) -> type[SteeringMethod]:
        """The class fitted on a behaviour: :attr:`method`'s, or :attr:`behaviour_method`'s in place of a method
        that needs harm categories (RepIt)."""
        name = self.behaviour_method if self.method_class().needs_categories else self.method
        try:
            return get(name)
        except KeyError as exc:
            raise ValueError(f"steering.behaviour_method: {exc.args[0] if exc.args else exc}") from None

    def behaviour_kwargs(self, fallback: bool = False) -> dict[str, Any]:
        """The behaviour method's config overrides (``fallback``: the auto fallback, which steers with
        :attr:`behaviour_scale` unless a scale is set). A stand-in :attr:`behaviour_method` gets the shared fields
        only: :attr:`method_options` are the options of :attr:`method`."""
        if not self.method_class().needs_categories:
            return self.method_kwargs()
        stand_in = self.behaviour_method_class()
        kwargs = self._shared(stand_in)
        if fallback and "scale" in stand_in.option_names() and "scale" not in kwargs:
            kwargs["scale"] = self.behaviour_scale
        return kwargs

    def validate(self) -> None:
        """Check everything that needs no model (``ValueError`` with what was expected)."""
        from interp import data as zd

        if self.applicable not in ("auto", "yes", "no"):
            raise ValueError(f"steering.applicable must be 'auto', 'yes' or 'no', got {self.applicable!r}")
        method_cls = self.method_class()
        method_cls.check_options(self.method_kwargs())  # the method's own rules (names; RepIt: values too)
        if self.behaviour not in ("auto", "refusal", *zd.behaviour_names()):
            raise ValueError(f"steering.behaviour must be 'auto', 'refusal' or a built-in behaviour "
                             f"({', '.join(zd.behaviour_names())}), got {self.behaviour!r}")
        if self.default_behaviour not in zd.behaviour_names():
            raise ValueError(f"steering.default_behaviour must be a built-in behaviour "
                             f"({', '.join(zd.behaviour_names())}), got {self.default_behaviour!r}")
        try:
            stand_in = get(self.behaviour_method)
        except KeyError as exc:
            raise ValueError(f"steering.behaviour_method: {exc.args[0] if exc.args else exc}") from None
        if stand_in.needs_categories:
            raise ValueError(f"steering.behaviour_method cannot be {self.behaviour_method!r} (it needs harm categories)")
        if self.data is not None:
            if self.behaviour not in ("auto",):
                raise ValueError("give steering.data (a contrastive JSON file) or steering.behaviour, not both")
            zd.load_behaviour(self.data)
        if method_cls.needs_categories and self.evaluation() != "refusal":
            raise ValueError(f"method {self.method!r} is evaluated on the refusal data set only (it needs harm "
                             "categories); drop steering.behaviour / steering.data or choose another method")
        if self.neutral_texts < 1:
            raise ValueError(f"steering.neutral_texts must be at least 1, got {self.neutral_texts}")


def _method_class(name: str) -> type[SteeringMethod]:
    """The steering method registered as ``name`` (``ValueError`` naming the available methods otherwise)."""
    try:
        return get(name)
    except KeyError as exc:  # unknown name, or a plug-in that fails to import (PluginError)
        raise ValueError(f"steering.method: {exc.args[0] if exc.args else exc}") from None


@dataclass
class SteeringCheckResult(Result):
    """What the steering check measured (``applicable=False``: only ``reason`` is meaningful)."""

    applicable: bool
    reason: str
    method: str = ""
    layer: int | None = None
    position: int | None = None
    rho: float | None = None
    targets: list = field(default_factory=list)
    rows: list = field(default_factory=list)  #: {"category", "group", "condition", "refusal_rate", "n"}
    kl: dict = field(default_factory=dict)
    baseline_probe: float | None = None
    dims_90: int | None = None
    summary_numbers: dict = field(default_factory=dict)
    examples: list = field(default_factory=list)
    #: "refusal", or the behaviour's name (then ``rows`` are {"metric", "condition", "value"})
    behaviour: str = "refusal"
    evaluation: dict = field(default_factory=dict)  #: evaluate_behaviour's output (behaviour runs)
    method_options: dict = field(default_factory=dict)  #: the options the method was built with
    note: str = ""  #: why the evaluation is not the one asked for (auto: refusal did not apply)
    kind: ClassVar[str] = "steering_check"

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows)

    def figure(self):
        import plotly.express as px

        df = self.to_frame()
        if df.empty:
            return None
        if self.behaviour != "refusal":
            shown = df[df["metric"].isin(list(BEHAVIOUR_BARS))].copy()
            shown["metric"] = shown["metric"].map(BEHAVIOUR_BARS)
            fig = px.bar(shown, x="metric", y="value", color="condition", barmode="group",
                         title=f"{self.method} on behaviour {self.behaviour!r}: before / after steering")
            fig.update_yaxes(range=[0, 1.05])
            return fig
        fig = px.bar(df, x="category", y="refusal_rate", color="condition", barmode="group",
                     title=f"Held-out refusal rate per category ({self.method}, layer {self.layer})")
        fig.update_yaxes(range=[0, 1.05])
        return fig


#: metrics of a behaviour run drawn in the figure (all in [0, 1]) and their labels
BEHAVIOUR_BARS = {"behaviour_rate": "behaviour rate (marker judge)", "probe_rate": "probe: share P > 0.5",
                  "probe_score": "probe: mean P(positive)"}
#: every per-condition metric of a behaviour run, in table order
BEHAVIOUR_METRICS = ("behaviour_rate", "behaviour_score", "probe_score", "probe_rate", "continuation_ppl")


class SteeringCheck(Check):
    name: ClassVar[str] = "steering"
    title: ClassVar[str] = "Steering (RepIt concept-isolated refusal vectors)"
    description: ClassVar[str] = ("Fits a steering method (any registered one) and reports, without and with the "
                                  "intervention, held-out refusal rates per category (refusal data set) or a "
                                  "contrastive behaviour's rate, probe score, neutral-text KL and coherence.")
    Config: ClassVar[type] = SteeringCheckConfig
    METRICS: ClassVar[dict[str, str]] = {
        "effect": "rate_steered - rate_none: the steering effect",
        "rate_none": "behaviour rate (refusal: target-category refusal rate) without steering",
        "rate_steered": "the same with the steering vector applied",
        "probe_effect": "probe score steered - unsteered (behaviour evaluation only)",
        "probe_accuracy": "held-out accuracy of the behaviour probe (behaviour evaluation only)",
        "kl_neutral": "KL divergence on neutral / harmless text caused by the vector (nats)",
        "ppl_ratio": "perplexity of the steered continuation / unsteered (coherence; behaviour evaluation only)",
    }
    TRENDS: ClassVar[dict[str, tuple[str, ...]]] = {"rate, without vs with steering": ("rate_none", "rate_steered")}

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.title = self._title()

    def _title(self, behaviour: str | None = None, method: str | None = None) -> str:
        """The section title names the method (and the behaviour once known)."""
        c = self.config
        method = method or c.method
        kind = behaviour or {"auto": None, "data": c.data}.get(c.evaluation(), c.evaluation())
        if kind == "refusal" and get(method).audit_title:  # the method names its refusal section (RepIt)
            return get(method).audit_title
        return f"Steering: method {method}" + (f" on {kind}" if kind else "")

    # ------------------------------------------------------------------ run
    def run(self, model, data: AuditData) -> SteeringCheckResult:
        c: SteeringCheckConfig = self.config  # validated when it was built (__post_init__)
        if c.applicable == "no":
            return SteeringCheckResult(False, "disabled (steering.applicable=no)", method=c.method)
        kind = c.evaluation()
        if kind not in ("auto", "refusal"):
            return self._run_behaviour(model, data, kind)
        ok, reason, base_rate = self._refusal_applies(model)
        if not ok and c.falls_back:  # judged on the built-in behaviour the model exhibits instead
            return self._run_behaviour(model, data, c.default_behaviour, fallback=True,
                                       note=f"not evaluated on refusal ({reason}); the built-in behaviour "
                                            f"'{c.default_behaviour}' instead")
        self.title = self._title("refusal")
        if not ok:
            return SteeringCheckResult(False, reason, baseline_probe=base_rate, method=c.method)
        return self._run_refusal(model, base_rate)

    def _refusal_applies(self, model) -> tuple[bool, str, float | None]:
        """``(applies, why not, baseline probe refusal rate)`` for the refusal evaluation (see the module docstring)."""
        c: SteeringCheckConfig = self.config
        if not has_chat_template(getattr(model, "tokenizer", None)):
            return False, "the model has no chat template, so the refusal data set does not apply", None
        try:
            from interp import data as zd
        except ImportError as exc:
            return False, f"the refusal data set is unavailable: {exc}", None
        base_rate = None
        if c.applicable == "auto":
            n_cat = len(zd.HARMFUL_CATEGORIES)
            probe = refusal_data(model.tokenizer, "val", max_per_category=max(1, -(-c.probe_prompts // n_cat)))
            tokens = refusal_token_ids(model.tokenizer)
            base_rate = float((refusal_scores(model, probe.positive, tokens, None, c.batch_size) > 0).float().mean())
        if base_rate is not None and base_rate < c.min_baseline_refusal:
            return False, (f"the model refuses only {base_rate:.0%} of the harmful probe prompts "
                           f"(< {c.min_baseline_refusal:.0%}): it has no refusal behaviour to steer"), base_rate
        return True, "", base_rate

    def _run_behaviour(self, model, data: AuditData, kind: str, note: str = "",
                       fallback: bool = False) -> SteeringCheckResult:
        """Fit the method on a contrastive behaviour and evaluate it (:func:`~interp.steering.behaviour.evaluate_behaviour`).

        ``fallback``: the auto evaluation's built-in behaviour (the method is :attr:`behaviour_method` in place of
        one that needs harm categories, and steers with :attr:`behaviour_scale` unless a scale is set)."""
        from interp import data as zd

        c: SteeringCheckConfig = self.config
        beh = zd.load_behaviour(c.data) if kind == "data" else zd.get_behaviour(kind)
        method_cls = c.behaviour_method_class()
        self.title = self._title(beh.name, method_cls.name)
        if model.tokenizer is None:
            return SteeringCheckResult(False, "the model has no tokenizer, so a text behaviour does not apply",
                                       method=method_cls.name, behaviour=beh.name)
        pos, neg = beh.split("train")
        kwargs = c.behaviour_kwargs(fallback)
        method = method_cls(**kwargs)
        vec = method.fit(model, SteeringData(pos, neg))
        ev = evaluate_behaviour(model, vec, beh, data.texts[:c.neutral_texts], c.probe_layer, c.max_new_tokens,
                                c.batch_size)
        rows = [{"metric": m, "condition": cond, "value": ev["conditions"][key][m]}
                for m in BEHAVIOUR_METRICS for cond, key in (("none", "none"), (method_cls.name, "steered"))
                if ev["conditions"][key][m] is not None]
        summary: dict[str, Any] = {"method": method_cls.name, "behaviour": beh.name, "layer": vec.layer}
        for m in ("behaviour_rate", "probe_score", "continuation_ppl"):
            for cond, key in (("none", "none"), ("steered", "steered")):
                if ev["conditions"][key][m] is not None:
                    summary[f"{m} {cond}"] = ev["conditions"][key][m]
        summary["kl_neutral"] = ev["kl_neutral"]
        summary["probe_test_accuracy"] = ev["probe_test_accuracy"]
        position = vec.metadata.get("position")
        if fallback:
            rate = ev["conditions"]["none"]["behaviour_rate"]
            shown = f"the unsteered model shows it on {rate:.0%} of its neutral prompts (marker judge)" \
                if rate is not None else "it needs no steering to appear"
            note = (f"{note}: a behaviour the model exhibits ({shown}; the probe separates its contrastive texts "
                    f"at {ev['probe_test_accuracy']:.2f} held-out accuracy), steered with scale "
                    f"{kwargs.get('scale', 'the method default')}" + (" (against the behaviour)" if
                                                                       kwargs.get("scale", 1) < 0 else "") +
                    "; --set steering.behaviour=refusal forces the refusal evaluation")
        return SteeringCheckResult(True, "", method_cls.name, vec.layer,
                                   position if isinstance(position, int) else None, None, [], rows,
                                   {method_cls.name: ev["kl_neutral"]}, None, None, summary, ev["examples"],
                                   behaviour=beh.name, evaluation=ev, method_options=kwargs, note=note)

    def _run_refusal(self, model, base_rate: float | None) -> SteeringCheckResult:
        """The refusal evaluation: per category, the refusal rate without steering, with each of the method's
        baselines and with its vector (:meth:`SteeringMethod.for_audit`, :meth:`SteeringMethod.audit_fit`)."""
        c: SteeringCheckConfig = self.config
        tok = model.tokenizer
        train = refusal_data(tok, "train", max_per_category=c.train_per_category, max_harmless=c.train_harmless)
        val = refusal_data(tok, "val", max_per_category=c.val_per_category, max_harmless=c.train_harmless)
        test = refusal_data(tok, "test", max_per_category=c.test_per_category, max_harmless=c.test_harmless)
        method = c.method_class().for_audit(model, c.method_kwargs(), val_per_category=c.val_per_category)
        fit = method.audit_fit(model, train, val)
        vec, name = fit.vector, c.method
        if name in fit.baselines:
            raise ValueError(f"method {name!r}'s audit_fit names a baseline after the method itself")
        ev = evaluate_refusal(model, {"none": None, **fit.baselines, name: vec}, test, test.negative, fit.targets,
                              None, None, c.max_new_tokens, c.batch_size, n_examples=1)
        judged, kl, examples = ev["judged"], ev["kl"], ev["examples"]
        targets, position = list(fit.targets), vec.metadata.get("position")
        counts: dict[str, int] = {}
        for cat in test.categories:
            counts[cat] = counts.get(cat, 0) + 1
        rows = [{"category": cat, "group": "target" if cat in targets else "non-target", "condition": cond,
                 "refusal_rate": rate, "n": counts[cat]}
                for cond, rates in judged.items() for cat, rate in rates.items()]
        summary = {"method": c.method, "layer": vec.layer, "baseline_probe_refusal": base_rate}
        for cond in judged:
            for grp in ("target", "non-target"):
                sel = [r for r in rows if r["condition"] == cond and r["group"] == grp]
                if sel:
                    n = sum(r["n"] for r in sel)
                    summary[f"{cond} {grp} refusal"] = sum(r["refusal_rate"] * r["n"] for r in sel) / n
        return SteeringCheckResult(True, "", c.method, vec.layer, position, fit.rho, targets, rows, kl, base_rate,
                                   fit.dims_90, summary, examples, method_options=c.method_kwargs())

    # ------------------------------------------------------------------ report
    def render(self, result: SteeringCheckResult) -> Rendered:
        if not result.applicable:
            return Rendered(html=f"<p>Skipped: {html.escape(result.reason)}.</p>")
        if result.behaviour != "refusal":
            return self._render_behaviour(result)
        bits = [f"method <b>{html.escape(result.method)}</b>", f"layer <b>{result.layer}</b>"]
        if result.position is not None:
            bits.append(f"fit position {result.position}")
        if result.rho is not None:
            bits.append(f"&rho; = {result.rho:.2f}")
        if result.targets:
            bits.append("targets " + ", ".join(html.escape(t) for t in result.targets))
        if result.dims_90 is not None:
            bits.append(f"{result.dims_90} residual dimensions hold 90% of the correction's squared norm")
        kl = ", ".join(f"{html.escape(k)} {v:.3f}" for k, v in result.kl.items())
        text = (f"<p>{'; '.join(bits)}.</p><p>Harmless-prompt KL divergence (nats): {kl}.</p>"
                "<p>Refusal rates are judged by string match on greedy generations of held-out test prompts.</p>")
        df = result.to_frame()
        table = df.pivot_table(index=["group", "category"], columns="condition", values="refusal_rate").reset_index()
        fig = result.figure()
        return Rendered(html=text, figures=[("Refusal rate per category", fig)] if fig is not None else [],
                        tables=[("Refusal rate per category (held-out)", table)])

    def _render_behaviour(self, result: SteeringCheckResult) -> Rendered:
        import pandas as pd

        ev = result.evaluation
        esc = html.escape
        opts = ", ".join(f"{esc(k)}={esc(repr(v))}" for k, v in result.method_options.items()) or "defaults"
        text = [f"<p>Method <b>{esc(result.method)}</b> ({opts}), layer <b>{result.layer}</b>, fitted on the "
                f"behaviour <b>{esc(result.behaviour)}</b> (train split of its contrastive texts); evaluated on its "
                f"{ev['n_prompts']} neutral prompts without and with the intervention.</p>"]
        if result.note:
            text.append(f"<p>Note: {esc(result.note)}.</p>")
        text.append(
            "<ul><li><b>behaviour rate</b>: share of prompts whose marker log-odds "
            "log&Sigma;P(positive markers) &minus; log&Sigma;P(negative markers) (teacher-forced, steered as in greedy "
            "generation) is &gt; 0" + ("" if ev["has_markers"] else " (not measured: this set has no markers)") +
            ";</li><li><b>probe</b>: logistic probe fitted on the unsteered last-token activations of the contrastive "
            f"train texts at <code>{esc(ev['probe_hook'])}</code>, read on the prompts' last token (held-out "
            f"accuracy on the test texts {ev['probe_test_accuracy']:.2f});</li>"
            f"<li><b>KL on neutral text</b>: mean per-token KL(p<sub>plain</sub> &#8214; p<sub>steered</sub>) over "
            f"{ev['n_neutral_texts']} audit texts ({ev['n_neutral_tokens']} tokens): <b>{ev['kl_neutral']:.4f}</b> "
            "nats;</li><li><b>coherence</b>: perplexity of the greedy continuation under the <i>unsteered</i> model "
            "(the unsteered continuation is the reference).</li></ul>")
        if ev.get("kl_tokens"):
            text.append("<p>Where steering moves the predictions on the first neutral text (each token coloured by "
                        "the KL of the next-token distribution read at it):</p>"
                        + token_view(ev["kl_tokens"]["tokens"], ev["kl_tokens"]["kl"],
                                     title=KL_VIEW_TITLE).html)
        df = result.to_frame()
        table = df.pivot_table(index="metric", columns="condition", values="value", sort=False).reset_index()
        examples = pd.DataFrame(result.examples)
        fig = result.figure()
        tables = [(f"Before / after steering ({result.behaviour})", table)]
        if not examples.empty:
            tables.append(("Greedy continuations", examples))
        return Rendered(html="".join(text), figures=[("Behaviour before / after steering", fig)] if fig is not None
                        else [], tables=tables)

    def summary(self, result: SteeringCheckResult) -> dict[str, Any]:
        if not result.applicable:
            return {"skipped": result.reason}
        return dict(result.summary_numbers)

    def to_json(self, result: SteeringCheckResult) -> dict[str, Any]:
        return result.to_dict()

    def metrics(self, result: SteeringCheckResult) -> dict[str, Any]:
        out: dict[str, Any] = dict.fromkeys(self.METRICS)
        if not result.applicable:
            return out
        if result.behaviour != "refusal":
            cond = result.evaluation["conditions"]
            none, steered = cond["none"], cond["steered"]
            out["rate_none"], out["rate_steered"] = none["behaviour_rate"], steered["behaviour_rate"]
            if none["probe_score"] is not None and steered["probe_score"] is not None:
                out["probe_effect"] = steered["probe_score"] - none["probe_score"]
            out["probe_accuracy"] = result.evaluation.get("probe_test_accuracy")
            out["kl_neutral"] = result.evaluation.get("kl_neutral")
            if none["continuation_ppl"] and steered["continuation_ppl"] is not None:
                out["ppl_ratio"] = steered["continuation_ppl"] / none["continuation_ppl"]
        else:
            sn = result.summary_numbers
            grp = "target" if "none target refusal" in sn else "non-target"  # a method without targets: all prompts
            conds = [k for k in (result.method,) if f"{k} {grp} refusal" in sn]
            out["rate_none"] = sn.get(f"none {grp} refusal")
            out["rate_steered"] = sn.get(f"{conds[0]} {grp} refusal") if conds else None
            out["kl_neutral"] = result.kl.get(conds[0]) if conds else None
        if out["rate_none"] is not None and out["rate_steered"] is not None:
            out["effect"] = out["rate_steered"] - out["rate_none"]
        return out


def _rates(flags: list[bool], cats: list[str]) -> dict[str, float]:
    out: dict[str, list[bool]] = {}
    for f, c in zip(flags, cats):
        out.setdefault(c, []).append(bool(f))
    return {c: sum(v) / len(v) for c, v in out.items()}


__all__ = ["SteeringCheck", "SteeringCheckConfig", "SteeringCheckResult"]
