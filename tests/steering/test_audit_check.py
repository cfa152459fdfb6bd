"""``interp audit --checks steering``: the check found through the interp.checks entry point."""
import copy
import json

import pytest

import interp
from interp.apps.audit import AuditData, get_check, run_audit

TEMPLATE = ("{% for m in messages %}<|bos|>user: {{ m['content'] }}<|eos|>{% endfor %}"
            "{% if add_generation_prompt %}\nbot:{% endif %}")


def test_registered_through_entry_point():
    cls = get_check("steering")
    assert cls.__module__ == "interp.steering.audit_check" and cls.Config().method == "repit"


def test_refusal_is_skipped_without_refusal_data(llama, tmp_path):
    """Refusal asked for on a model without a chat template: `skipped` with the reason (not `ok`)."""
    report = run_audit(llama, ["steering"], AuditData(["hello"]), out=tmp_path / "r",
                       options={"steering": {"behaviour": "refusal"}})
    rec = report.checks[0]
    assert rec.status == "skipped" and not rec.result.applicable and "chat template" in rec.result.reason
    assert rec.reason == rec.result.reason and report.ok
    assert set(rec.metrics) == set(get_check("steering").METRICS) and rec.metrics["effect"] is None
    assert "Skipped: the model has no chat template" in (tmp_path / "r" / "index.html").read_text()
    data = json.loads((tmp_path / "r" / "results.json").read_text())
    assert data["checks"][0]["status"] == "skipped" and "chat template" in data["checks"][0]["reason"]


def test_default_evaluates_a_behaviour_the_model_has(llama, tmp_path):
    """The default (RepIt, behaviour auto) on a model without refusal data: the built-in `sentiment` with
    diff_in_means steered against it (scale -1), the note saying which behaviour and why."""
    opts = {"max_new_tokens": "2", "neutral_texts": "1", "layer": "1"}
    report = run_audit(llama, ["steering"], AuditData(["hello there"]), options={"steering": opts}, keep_going=False)
    rec = report.checks[0]
    res = rec.result
    assert rec.status == "ok" and res.behaviour == "sentiment" and res.method == "diff_in_means"
    assert res.method_options == {"layer": 1, "batch_size": 16, "scale": -1.0}
    assert rec.title == "Steering: method diff_in_means on sentiment"
    assert "no chat template" in res.note and "a behaviour the model exhibits" in res.note
    assert "against the behaviour" in res.note and "steering.behaviour=refusal" in res.note
    ev = res.evaluation["conditions"]
    assert rec.metrics["rate_none"] == ev["none"]["behaviour_rate"]
    assert rec.metrics["effect"] == pytest.approx(ev["steered"]["behaviour_rate"] - ev["none"]["behaviour_rate"])
    assert rec.metrics["kl_neutral"] == res.evaluation["kl_neutral"] > 0


def test_runs_repit_section_on_a_chat_model(llama, tmp_path):
    tok = copy.deepcopy(llama.tokenizer)
    tok.chat_template = TEMPLATE
    model = interp.wrap(llama.hf_model, tok)
    opts = {"applicable": "yes", "train_per_category": "2", "train_harmless": "4", "val_per_category": "1",
            "test_per_category": "1", "test_harmless": "4", "max_new_tokens": "3", "layer": "1",
            "position": "-1", "rho": "0.5"}
    report = run_audit(model, ["steering"], AuditData(["hello"]), out=tmp_path / "r", options={"steering": opts},
                       keep_going=False)
    res = report.checks[0].result
    assert res.applicable and res.method == "repit" and res.layer == 1 and res.rho == 0.5
    df = res.to_frame()
    assert set(df["condition"]) == {"none", "natural", "repit"} and len(df) == 3 * 11
    assert set(df.loc[df.group == "target", "category"]) == {"bio", "chem", "nuclear"}
    assert set(res.kl) == {"natural", "repit"} and all(v >= 0 for v in res.kl.values())
    page = (tmp_path / "r" / "index.html").read_text()
    assert "Refusal rate per category" in page and "repit" in page
    payload = json.loads((tmp_path / "r" / "results.json").read_text())
    assert "steering" in json.dumps(payload)
    with pytest.raises(ValueError, match="applicable"):
        get_check("steering")(get_check("steering").Config(applicable="maybe")).run(model, AuditData(["x"]))


# ------------------------------------------------------------------ any method, through the interface only
from dataclasses import dataclass  # noqa: E402

import torch  # noqa: E402

from interp import steering  # noqa: E402
from interp.checks import configure  # noqa: E402
from interp.steering.base import AuditFit, SteeringMethod, SteeringVector  # noqa: E402


@dataclass
class _ShiftConfig:
    layer: int = 0
    scale: float = 1.0
    batch_size: int = 16
    tag: str = "plain"  # an option the check knows nothing about


class _MeanShift(SteeringMethod):
    """A third-party method the check has never heard of: the harmful-minus-harmless mean at the last token, added
    at ``blocks.{layer}.hook_resid_pre``; its audit fit adds a half-strength baseline and names a target category."""

    name = "test_mean_shift"
    config_class = _ShiftConfig
    built_with: list = []

    @classmethod
    def check_options(cls, options):
        super().check_options(options)
        if options.get("tag") == "bad":
            raise ValueError("method 'test_mean_shift' option 'tag' must not be 'bad'")

    @classmethod
    def for_audit(cls, model, options, val_per_category):
        cls.built_with.append((dict(options), val_per_category))
        return super().for_audit(model, options, val_per_category)

    def fit(self, model, data=None, val=None):
        c = self.config
        hook = f"blocks.{c.layer}.hook_resid_pre"
        r = steering.last_token(model, data.positive, hook).mean(0) - steering.last_token(model, data.negative, hook).mean(0)
        return SteeringVector(method=self.name, operation="add", hooks=(hook,), direction=r, scale=c.scale,
                              metadata={"layer": c.layer, "position": -1, "tag": c.tag})

    def audit_fit(self, model, train, val):
        vec = self.fit(model, train, val)
        return AuditFit(vec, baselines={"half": vec.with_scale(vec.scale / 2)}, targets=["bio"], rho=0.25)


@pytest.fixture
def mean_shift():
    steering.register(_MeanShift)
    _MeanShift.built_with.clear()
    try:
        yield _MeanShift
    finally:
        steering.unregister(_MeanShift.name)


def test_a_method_registered_in_process_runs_through_the_check_end_to_end(llama, mean_shift, tmp_path):
    """No edit to the check: a new method's options reach it as given (its own option `tag` included), its
    baselines and targets shape the refusal table, its vector's KL is measured, and the page and metrics follow."""
    tok = copy.deepcopy(llama.tokenizer)
    tok.chat_template = TEMPLATE
    model = interp.wrap(llama.hf_model, tok)
    opts = {"method": "test_mean_shift", "applicable": "yes", "train_per_category": "2", "train_harmless": "4",
            "val_per_category": "1", "test_per_category": "1", "test_harmless": "4", "max_new_tokens": "2",
            "layer": "1", "scale": "4", "tag": "mine"}
    report = run_audit(model, ["steering"], AuditData(["hello"]), out=tmp_path / "r", options={"steering": opts},
                       keep_going=False)
    rec = report.checks[0]
    res = rec.result
    assert rec.status == "ok" and res.applicable and res.method == "test_mean_shift" and res.behaviour == "refusal"
    assert mean_shift.built_with == [({"layer": 1, "batch_size": 16, "scale": 4.0, "tag": "mine"}, 1)]
    assert res.method_options == {"layer": 1, "batch_size": 16, "scale": 4.0, "tag": "mine"}
    assert rec.title == "Steering: method test_mean_shift on refusal"
    df = res.to_frame()
    assert list(dict.fromkeys(df["condition"])) == ["none", "half", "test_mean_shift"] and len(df) == 3 * 11
    assert set(df.loc[df.group == "target", "category"]) == {"bio"} and res.targets == ["bio"] and res.rho == 0.25
    assert res.layer == 1 and res.position == -1 and res.dims_90 is None
    # the KL of each steered condition on the harmless test prompts; half the push moves the predictions less
    assert set(res.kl) == {"half", "test_mean_shift"} and 0 < res.kl["half"] < res.kl["test_mean_shift"]
    assert [e["category"] for e in res.examples] == ["bio"] and {"none", "half", "test_mean_shift"} <= set(res.examples[0])
    assert rec.metrics["rate_steered"] == res.summary_numbers["test_mean_shift target refusal"]
    assert rec.metrics["kl_neutral"] == res.kl["test_mean_shift"]
    assert "test_mean_shift" in (tmp_path / "r" / "index.html").read_text()
    # the same method on a behaviour (it needs no categories): fitted on the contrastive texts, options as given
    beh = run_audit(llama, ["steering"], AuditData(["Some text.", "More."]), options={"steering": {
        "method": "test_mean_shift", "behaviour": "uppercase", "layer": "1", "tag": "b", "max_new_tokens": "2",
        "neutral_texts": "2"}}, keep_going=False).checks[0]
    assert beh.status == "ok" and beh.result.behaviour == "uppercase" and beh.result.method == "test_mean_shift"
    assert beh.result.method_options == {"layer": 1, "batch_size": 16, "tag": "b"}
    assert beh.title == "Steering: method test_mean_shift on uppercase"
    # the method's own rule on its options runs when the config is built, before any model loads
    with pytest.raises(ValueError, match="method 'test_mean_shift' option 'tag'"):
        configure(get_check("steering"), {"method": "test_mean_shift", "tag": "bad"})


def test_a_method_that_needs_categories_is_evaluated_on_refusal_only(mean_shift):
    """`needs_categories` is the method's to declare: the check then asks for refusal, refuses a behaviour, and a
    fallback fits the stand-in `behaviour_method` with the shared options only."""
    class Categorical(_MeanShift):
        name = "test_categorical"
        needs_categories = True
        audit_title = "Steering (categorical)"

    steering.register(Categorical)
    try:
        cls = get_check("steering")
        cfg = configure(cls, {"method": "test_categorical", "tag": "t", "layer": "1"})
        assert cfg.evaluation() == "refusal" and cls(cfg).title == "Steering (categorical)"
        assert cfg.behaviour_method_class().name == "diff_in_means"
        assert cfg.behaviour_kwargs(fallback=True) == {"layer": 1, "batch_size": 16, "scale": -1.0}
        with pytest.raises(ValueError, match="method 'test_categorical' is evaluated on the refusal data set only"):
            configure(cls, {"method": "test_categorical", "behaviour": "sentiment"})
        with pytest.raises(ValueError, match="behaviour_method cannot be 'test_categorical'"):
            configure(cls, {"method": "diff_in_means", "behaviour_method": "test_categorical"})
    finally:
        steering.unregister(Categorical.name)


@pytest.mark.parametrize("option, value", [("targets", "bio"), ("rho", "0.5"), ("candidate_layers", "0,3"),
                                           ("nontarget_retain", "0.9"), ("intervention", "ablation")])
def test_repit_options_given_to_another_method_are_refused_naming_it(option, value):
    """RepIt's options are RepIt's: on diff_in_means they are refused, naming the method, as `--set` strings and as
    a config built in Python; on repit they parse to RepItConfig's types and reach the method as given."""
    cls = get_check("steering")
    with pytest.raises(ValueError, match=rf"no option '{option}'.*method 'diff_in_means'"):
        configure(cls, {"method": "diff_in_means", option: value})
    with pytest.raises(ValueError, match=rf"method 'diff_in_means' has no option '{option}'"):
        cls.Config(method="diff_in_means", method_options={option: 1})
    cfg = configure(cls, {option: value})
    assert cfg.method == "repit" and set(cfg.method_options) == {option}
    expected = {"targets": ("bio",), "rho": 0.5, "candidate_layers": (0, 3), "nontarget_retain": 0.9,
                "intervention": "ablation"}[option]
    assert cfg.method_options[option] == expected and cfg.method_kwargs() == {"batch_size": 16, option: expected}


@pytest.mark.parametrize("option, value, expected", [
    ("intervention", "both", "one of affine, ablation"), ("rho", "1.5", r"None or a number in \[0, 1\]"),
    ("nontarget_retain", "-0.1", r"None or a number in \[0, 1\]"), ("targets", "", "a non-empty list"),
    ("reweight", "cosine", "one of invnorm"), ("candidate_layers", "-1", "layer numbers >= 0"),
    ("max_select_prompts", "0", "integer >= 1"), ("position", "2", "negative position")])
def test_repit_validates_its_own_options_before_any_model_loads(option, value, expected):
    with pytest.raises(ValueError, match=rf"method 'repit' option '{option}' must be .*{expected}"):
        configure(get_check("steering"), {option: value})


def test_repit_audit_defaults_yield_to_given_options(llama):
    """RepIt.for_audit: nontarget_retain 0.9, the select-prompt cap from the check's val size, and the candidate-layer
    rule (every third layer of the first 80%, only with more than 6 such layers) unless a layer and position are
    fixed; every option given wins."""
    from types import SimpleNamespace

    from interp.steering.repit import RepIt

    deep = SimpleNamespace(cfg=SimpleNamespace(n_layers=30))
    c = RepIt.for_audit(deep, {"batch_size": 4}, val_per_category=6).config
    assert (c.nontarget_retain, c.max_select_prompts, c.batch_size) == (0.9, 24, 4)
    assert c.candidate_layers == tuple(range(0, 24, 3))
    assert RepIt.for_audit(llama, {}, val_per_category=1).config.candidate_layers is None  # 2 layers: all
    assert RepIt.for_audit(deep, {"layer": 5, "position": -1}, 1).config.candidate_layers is None  # fixed
    given = RepIt.for_audit(deep, {"nontarget_retain": None, "max_select_prompts": 3, "candidate_layers": (2,)}, 6).config
    assert (given.nontarget_retain, given.max_select_prompts, given.candidate_layers) == (None, 3, (2,))
