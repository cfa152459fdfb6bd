"""Validation 3 of TCPE (digest §5) on a real LM: single-fact counterfactual edits of facts the model knows
(capitals, languages, currencies), with TCPE, ROME on the transcoder, ROME on the MLP and constrained
fine-tuning side by side.

Per edit (applied alone, then reverted): **efficacy** (the target's first token is the top-1 next token of the
rewriting prompt), **paraphrase** (the same on a paraphrased prompt), **neighbourhood** (fraction of the other
known facts, every relation, other subjects, whose top-1 first token is still the true one), **perplexity** on
held-out real text (the Book of Ruth, :func:`interp.data.heldout_text`), rows changed. The transcoder methods are
measured against the spliced model (transcoder in place of the MLP, no error term, as TCPE swaps it in), the MLP
methods against the plain model; only facts both know are edited.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from interp.progress import progress
from interp.results import TableResult

from interp.editing.rome import EditConfig, EditRequest, FineTuneConfig, MLPSite, TranscoderSite, context_templates, \
    fine_tune, rank_one, restrict
from interp.editing.transcoders import Transcoder, TranscoderTrainingConfig, splice

from .facts import applied

# (relation, prompt, paraphrase, {subject: object})
RELATIONS = {
    "capital": ("The capital of {} is", "The capital city of {} is", {
        "France": " Paris", "Germany": " Berlin", "Italy": " Rome", "Spain": " Madrid", "Japan": " Tokyo",
        "China": " Beijing", "Russia": " Moscow", "England": " London", "Egypt": " Cairo", "Greece": " Athens",
        "Portugal": " Lisbon", "Canada": " Ottawa", "Australia": " Canberra", "India": " New", "Poland": " Warsaw",
        "Sweden": " Stockholm", "Norway": " Oslo", "Turkey": " Ankara", "Ireland": " Dublin",
        "the Netherlands": " Amsterdam", "Belgium": " Brussels", "Austria": " Vienna", "Kenya": " Nairobi",
        "Peru": " Lima", "Cuba": " Havana", "Iran": " Tehran", "Iraq": " Baghdad", "Thailand": " Bangkok",
        "Vietnam": " Hanoi", "South Korea": " Seoul", "Finland": " Helsinki", "Denmark": " Copenhagen",
        "Hungary": " Budapest", "Chile": " Santiago", "Ukraine": " Kiev", "Argentina": " Buenos",
        "Indonesia": " Jakarta", "the Philippines": " Manila", "Scotland": " Edinburgh", "Mexico": " Mexico"}),
    "language": ("The official language of {} is", "The main language spoken in {} is", {
        "France": " French", "Germany": " German", "Italy": " Italian", "Spain": " Spanish", "Japan": " Japanese",
        "China": " Chinese", "Russia": " Russian", "Greece": " Greek", "Portugal": " Portuguese",
        "Brazil": " Portuguese", "Mexico": " Spanish", "Poland": " Polish", "Sweden": " Swedish",
        "Norway": " Norwegian", "Turkey": " Turkish", "the Netherlands": " Dutch", "Finland": " Finnish",
        "Denmark": " Danish", "Hungary": " Hungarian", "Egypt": " Arabic", "Iran": " Persian", "Thailand": " Thai",
        "Vietnam": " Vietnamese", "South Korea": " Korean", "Israel": " Hebrew", "Argentina": " Spanish",
        "Ukraine": " Ukrainian", "Indonesia": " Indonesian"}),
    "currency": ("The currency of {} is the", "The official currency of {} is the", {
        "Japan": " yen", "England": " pound", "the United States": " US", "Russia": " ruble", "India": " rupee",
        "China": " yuan", "Mexico": " peso", "Switzerland": " Swiss", "Europe": " Euro", "South Korea": " South",
        "Poland": " Polish", "Sweden": " krona", "Turkey": " Turkish", "Thailand": " baht"}),
}


@dataclass(frozen=True)
class Fact:
    """A fact ``subject --relation--> obj``; ``template`` / ``para`` are the relation's prompt and paraphrase
    (``"{}"`` = the subject; empty: the built-in :data:`RELATIONS`)."""

    relation: str
    subject: str
    obj: str
    template: str = ""
    para: str = ""

    @property
    def prompt(self) -> str:
        return (self.template or RELATIONS[self.relation][0]).format(self.subject)

    @property
    def paraphrase(self) -> str:
        return (self.para or RELATIONS[self.relation][1]).format(self.subject)

    def request(self, target: str) -> EditRequest:
        return EditRequest(self.template or RELATIONS[self.relation][0], self.subject, target)


def all_facts(relations: dict | None = None) -> list[Fact]:
    """Every fact of ``relations`` (``{relation: (prompt, paraphrase, {subject: object})}``; default
    :data:`RELATIONS`)."""
    rel = RELATIONS if relations is None else relations
    return [Fact(r, s, o, *((p, q) if relations is not None else ())) for r, (p, q, table) in rel.items()
            for s, o in table.items()]


def _first(model, text: str) -> int:
    return int(model.to_tokens(text, prepend_bos=False)[0, 0])


@torch.no_grad()
def top1(model, prompts: Sequence[str], batch_size: int = 32) -> list[int]:
    """Greedy next token of each prompt (left-padded batches)."""
    out = []
    for i in range(0, len(prompts), batch_size):
        batch = model.prepare(list(prompts[i:i + batch_size]), padding_side="left")
        out.extend(model(batch)[:, -1].argmax(-1).tolist())
    return out


def known_facts(model, facts: Sequence[Fact] | None = None) -> tuple[list[Fact], np.ndarray]:
    """The facts whose object's first token is the model's greedy next token (``known``), and the mask over
    ``facts`` (paraphrase knowledge is not required)."""
    facts = list(facts or all_facts())
    pred = top1(model, [f.prompt for f in facts])
    ok = np.array([p == _first(model, f.obj) for p, f in zip(pred, facts)])
    return [f for f, k in zip(facts, ok) if k], ok


@torch.no_grad()
def perplexity(model, texts: Sequence[str], batch_size: int = 8, max_length: int = 128) -> float:
    """Token-weighted perplexity of ``texts`` (batched by length, so little padding is computed; the value
    does not depend on the batching)."""
    from interp.model import next_token_loss
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    texts = [texts[i] for i in order]
    tot = n = 0.0
    for i in range(0, len(texts), batch_size):
        batch = model.prepare(model.tokenize(list(texts[i:i + batch_size]), max_length=max_length))
        w = float((batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1]).sum())
        tot += float(next_token_loss(model(batch), batch)) * w
        n += w
    return float(np.exp(tot / max(n, 1)))


@dataclass
class RealEditComparison(TableResult):
    """Per (method, edit): efficacy, paraphrase, neighbourhood, locality, perplexity, rows changed.

    ``neighbourhood``: fraction of the other facts the edited model state knows (plain model for MLP methods,
    spliced model for transcoder methods) whose true object is still its top-1; ``locality``: fraction of
    *all* other facts the plain model knows (``n_locality`` ≥ 50 with the built-in table) whose top-1 token is
    the same as before the edit, in the same model state."""

    kind = "real_edit_comparison"
    def summary(self):
        return self.to_frame().groupby("method").agg(
            efficacy=("efficacy", "mean"), paraphrase=("paraphrase", "mean"), neighbourhood=("neighbourhood", "mean"),
            locality=("locality", "mean"), n_locality=("n_locality", "mean"),
            ppl_before=("ppl_before", "mean"), ppl_after=("ppl_after", "mean"), n_changed=("n_changed", "mean"),
            frac_changed=("frac_changed", "mean"), residual=("residual", "mean"), final_nll=("final_nll", "mean"),
            n=("efficacy", "size")).reset_index()

    def figure(self):
        import plotly.express as px
        s = self.summary()
        return px.bar(s.melt(id_vars="method", value_vars=["efficacy", "paraphrase", "neighbourhood", "locality"]),
                      x="variable", y="value", color="method", barmode="group", title="single-fact edits")


def edit_plan(both: Sequence[Fact], n_edits: int, seed: int = 0, relations: dict | None = None
              ) -> list[tuple[Fact, str]]:
    """The first ``n_edits`` of a fixed random order of ``both``, each with a new object of its relation drawn
    by its own generator (``seed``, index): a larger ``n_edits`` extends the plan without changing its start.
    ``relations``: where the relation's objects come from (default :data:`RELATIONS`)."""
    rel = RELATIONS if relations is None else relations
    order = np.random.default_rng(seed).permutation(len(both))
    out = []
    for i in order[:n_edits]:
        f = both[int(i)]
        objs = sorted({o for o in rel[f.relation][2].values()} - {f.obj})
        out.append((f, objs[int(np.random.default_rng([seed, int(i)]).integers(len(objs)))]))
    return out


def compare_real(model, transcoder: Transcoder, layer: int, n_edits: int = 10, taus: Sequence[float] = (0.5,),
                 config: EditConfig | None = None, ft_config: FineTuneConfig | None = None,
                 heldout: Sequence[str] = (), C_tc: torch.Tensor | None = None, C_mlp: torch.Tensor | None = None,
                 seed: int = 0, methods: Sequence[str] = ("tcpe", "rome_tc", "rome", "ft"), log=None,
                 templates: Sequence[str] | None = None, relations: dict | None = None,
                 stage: Callable[[str, Callable[[], list]], list] | None = None,
                 reverse: bool = False) -> RealEditComparison:
    """Edit ``n_edits`` known facts of ``model`` (each to another object of its relation, :func:`edit_plan`)
    with every method, each edit applied alone and reverted.

    ``C_tc`` / ``C_mlp``: the second moments of the transcoder features and of the MLP key (needed by the
    transcoder methods and by ``rome``); ``heldout``: texts for the perplexity. TCPE's masks share one
    unmasked ``compute_v`` (:func:`~interp.editing.rome.restrict`); masks with the same rows (e.g. two τ that
    keep the same features of ``k*``) have the same update and are evaluated once. ``relations``: the facts
    (default :data:`RELATIONS`).

    ``stage(name, compute)``: each (edit, method group) is computed through it (``tc``: TCPE's taus and ROME on
    the transcoder; ``rome``; ``ft``), e.g. an :class:`interp.stages.Stages` object, so an interrupted run
    resumes at the first unfinished edit; ``reverse=True`` walks the plan from its end (a second process on
    the same stages shares the work). Rows are returned in plan order.
    """
    cfg = config or EditConfig()
    ft_cfg = ft_config or FineTuneConfig()
    facts = all_facts(relations)
    known, _ = known_facts(model, facts)
    with splice(model, layer, transcoder):
        known_tc, _ = known_facts(model, known)
        pred_tc = top1(model, [g.prompt for g in known])  # spliced model's answers before any edit
        ppl_tc = perplexity(model, heldout)
    ppl = perplexity(model, heldout)
    both = [f for f in known if f in set(known_tc)]
    templates = list(templates) if templates is not None else context_templates(model, cfg)
    out = RealEditComparison(baseline={"n_facts": len(facts), "known": len(known), "known_spliced": len(known_tc),
                                       "ppl": ppl, "ppl_spliced": ppl_tc, "templates": templates, "layer": layer})
    if log:
        log(f"baseline {out.baseline}")
    groups = [g for g in ("tc", "rome", "ft") if (g == "tc" and {"tcpe", "rome_tc"} & set(methods)) or g in methods]
    if "tc" in groups and C_tc is None or "rome" in groups and C_mlp is None:
        raise ValueError("compare_real: the transcoder methods need C_tc and ROME on the MLP needs C_mlp")
    plan = edit_plan(both, n_edits, seed, relations)
    tc_site = TranscoderSite(model, layer, transcoder)
    stage = stage or (lambda name, compute: compute())

    def group_rows(i: int, g: str) -> list[dict]:
        f, new = plan[i]
        req = f.request(new)
        tgt = _first(model, new)
        if g == "tc":
            full = rank_one(tc_site, req, C_tc, cfg, tau=-1.0, method="rome_tc", templates=templates)
            edits = ([restrict(full, t, site=tc_site) for t in taus] if "tcpe" in methods else []) \
                + ([full] if "rome_tc" in methods else [])
        elif g == "rome":
            edits = [rank_one(MLPSite(model, layer), req, C_mlp, cfg, method="rome", templates=templates)]
        else:
            edits = [fine_tune(model, req, layer, ft_cfg, templates=templates[:1], apply=False)]
        rows, seen = [], {}
        for e in edits:
            tc_on = e.site == "transcoder"
            others = [j for j, h in enumerate(known) if h.subject != f.subject]
            same = (e.site, tuple(e.rows.tolist())) if g == "tc" else None  # same full edit + rows = same delta
            if same is not None and same in seen:
                p, ppl_after = seen[same]
            else:
                with applied(e, model, transcoder), (splice(model, layer, transcoder) if tc_on else _null()):
                    p = top1(model, [f.prompt, f.paraphrase] + [known[j].prompt for j in others])
                    ppl_after = perplexity(model, heldout)
                if same is not None:
                    seen[same] = (p, ppl_after)
            ref = set(known_tc) if tc_on else set(known)
            before = pred_tc if tc_on else [_first(model, h.obj) for h in known]
            neigh = [pi == _first(model, known[j].obj) for pi, j in zip(p[2:], others) if known[j] in ref]
            loc = [pi == before[j] for pi, j in zip(p[2:], others)]
            row = {"edit": i, "method": e.method if e.method != "tcpe" else f"tcpe(tau={e.tau})",
                   "relation": f.relation, "subject": f.subject, "old": f.obj, "new": new,
                   "efficacy": float(p[0] == tgt), "paraphrase": float(p[1] == tgt),
                   "neighbourhood": float(np.mean(neigh)) if neigh else float("nan"), "n_neighbours": len(neigh),
                   "locality": float(np.mean(loc)) if loc else float("nan"), "n_locality": len(loc),
                   "ppl_before": ppl_tc if tc_on else ppl, "ppl_after": ppl_after, "n_changed": e.n_changed,
                   "d_key": e.d_key, "frac_changed": e.n_changed / e.d_key, "residual": e.residual,
                   "final_nll": e.log["nll"][-1] if e.log.get("nll") else float("nan"),
                   "cos_uk": e.log.get("cos_uk", float("nan"))}
            rows.append(row)
            if log:
                log(str(row))
        return rows

    results: dict = {}
    order = list(range(len(plan)))[::-1] if reverse else list(range(len(plan)))
    for i in progress(order, desc="edits"):
        for g in groups:
            results[i, g] = stage(f"edit-{i:03d}-{g}", lambda i=i, g=g: group_rows(i, g))
    out.rows.extend(r for i in range(len(plan)) for g in groups for r in results[i, g])
    return out


@torch.no_grad()
def subject_activation_quantiles(model, layer: int, transcoder: Transcoder, facts: Sequence[Fact],
                                 qs: Sequence[float] = (0.5, 0.9, 0.97)) -> tuple[dict, float]:
    """Quantiles of the active transcoder features at the subject's last token of the facts' prompts, and the
    mean number active there (the τ scale of TCPE on this transcoder: ``τ`` = a quantile keeps about
    ``(1 − q)`` of the features a subject activates)."""
    vals = []
    with splice(model, layer, transcoder) as s:
        for f in facts:
            n = model.to_tokens(f.prompt.split(f.subject)[0] + f.subject).shape[1]
            _, c = model.run_with_cache(f.prompt, names=[s.features], stop_at_layer=layer + 1)
            z = c[s.features][0, n - 1]
            vals.append(z[z > 0].float().cpu())
    v = torch.cat(vals)
    return {q: float(v.quantile(q)) for q in qs}, len(v) / max(len(facts), 1)


def training_documents() -> list[str]:
    """The transcoder's real-text mix: KJV passages of 12 verses (Ruth held out) with a block of 6 instructions
    of :func:`interp.data.refusal_instructions` (modern English) after every 4 passages."""
    from interp.data import kjv_text, refusal_instructions
    lines = kjv_text().splitlines()
    kjv = ["\n".join(lines[i:i + 12]) for i in range(0, len(lines), 12)]
    ins = [x.text for x in refusal_instructions()]
    blocks = ["\n".join(ins[i:i + 6]) for i in range(0, len(ins), 6)]
    docs, j = [], 0
    for i, d in enumerate(kjv):
        docs.append(d)
        if i % 4 == 3 and j < len(blocks):
            docs.append(blocks[j])
            j += 1
    return docs


def moment_texts(docs: Sequence[str], n_tokens: int) -> list[str]:
    """The real text of the second moments: for ``n_tokens ≤ 8000`` the 75 passages ``docs[1700:1775]`` of the
    earlier runs (truncated to 128 tokens each: ~9,600 tokens); above, every passage from ``docs[1700]`` on split
    into its two halves (6 verses / 3 instructions each, ~1,300 pieces of ≤ 128 tokens, ~150k tokens), so that
    ``n_tokens`` = 100,000 TOKENS is reached (the first 784 pieces with SmolLM2's tokenizer; not ROME's ``mom2_n_samples``, which counts
    100,000 TEXTS of up to 1,024 tokens: docs/editing.md). None of it is in the transcoder's training
    store (its 160k tokens come from the first ~400 passages) or in the held-out text (Ruth)."""
    if n_tokens <= 8000:
        return list(docs[1700:1775])
    out = []
    for d in docs[1700:]:
        lines = d.splitlines()
        h = (len(lines) + 1) // 2
        out.extend(x for x in ("\n".join(lines[:h]), "\n".join(lines[h:])) if x.strip())
    return out


def plan_keys(model, layer: int, transcoder: Transcoder, n_edits: int | None, templates: Sequence[str],
              seed: int = 0, fact_token: str = "subject_last", relations: dict | None = None):
    """The edit plan of :func:`compare_real` (facts both the plain and the spliced model know, :func:`edit_plan`)
    and the keys ``k*`` of its requests at both sites, before any edit: ``(plan, keys_tc [n, d_sae],
    keys_mlp [n, d_mlp])``. ``n_edits=None``: the full plan (every fact both know), whose start is the plan of
    any ``n_edits``."""
    from interp.editing.rome import compute_key
    known, _ = known_facts(model, all_facts(relations))
    with splice(model, layer, transcoder):
        known_tc, _ = known_facts(model, known)
    both = [f for f in known if f in set(known_tc)]
    plan = edit_plan(both, len(both) if n_edits is None else n_edits, seed, relations)
    tc_site, mlp_site = TranscoderSite(model, layer, transcoder), MLPSite(model, layer)
    reqs = [f.request(new) for f, new in plan]
    keys_tc = torch.stack([compute_key(tc_site, r, templates, fact_token) for r in reqs])
    keys_mlp = torch.stack([compute_key(mlp_site, r, templates, fact_token) for r in reqs])
    return plan, keys_tc, keys_mlp


def tau_for_fraction(keys: torch.Tensor, frac: float, step: float = 1e-3) -> tuple[float, float]:
    """TCPE's τ by the digest's recipe rule "|S| ≈ 1–3% of d_tc", made exact: the smallest τ on a grid of
    ``step`` such that the mean over ``keys [n, d]`` of ``|S| = |{a : k*_a > 0, k*_a ≥ τ}|`` is at most
    ``frac · d`` (τ = 0 when the keys' own supports are already that small). Uses the keys only, never edit
    outcomes. Returns ``(τ, mean |S| / d)``."""
    d = keys.shape[1]
    pos = [k[k > 0].sort().values for k in keys]

    def mean_s(t: float) -> float:
        return float(np.mean([len(v) - int(torch.searchsorted(v, torch.tensor(t, dtype=v.dtype))) for v in pos]))

    if mean_s(0.0) <= frac * d:
        return 0.0, mean_s(0.0) / d
    lo, hi = 0, int(np.ceil(float(max(float(v[-1]) for v in pos if len(v)) / step))) + 1  # grid index bisection
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if mean_s(mid * step) <= frac * d else (mid, hi)
    t = round(hi * step, 6)
    return t, mean_s(t) / d


def ridge_rule(moments: dict, tiny_ok: int = 0, cos_ratio: float = 0.5, ridge: float = 1e-2) -> float:
    """The ridge of :func:`real_validation` from the second-moment diagnostics (rule fixed before they were
    computed): 0 if the transcoder's ``C`` has at most ``tiny_ok`` eigenvalues below 1e-6 · mean(diag C) on the
    features active in the text and the median ``cos(u, k*)`` without ridge over the plan's keys is at least
    ``cos_ratio`` times the MLP site's (ROME's own site); otherwise ``ridge`` (the earlier runs' 1e-2)."""
    tc, mlp = moments["tc"], moments["mlp"]
    ok = tc["n_tiny_active"] <= tiny_ok and \
        float(np.median(tc["cos_uk_ridge0"])) >= cos_ratio * float(np.median(mlp["cos_uk_ridge0"]))
    return 0.0 if ok else ridge


@torch.no_grad()
def mask_leak(C: torch.Tensor, keys: torch.Tensor, taus: Sequence[float], eps_rel: float = 0.0) -> list[dict]:
    """Why a mask can cost locality, from ``C [d, d]`` and the plan's keys ``keys [n, d]`` alone (no edit).

    The update ``ΔW = r uᵀ / (uᵀk*)`` restricted to the rows ``S`` changes the output on a token with features
    ``k`` by ``(u_S · k) / (uᵀk*) · r``. Per key (``u`` = :func:`~interp.editing.rome.left_vector` with the ridge
    ``eps_rel · mean(diag C)``) and per mask (``"full"``: every row; each τ: ``S = {a : k*_a > 0, k*_a ≥ τ}``):
    ``rms`` = ``√(u_Sᵀ C u_S) / |uᵀk*|`` (the RMS effect over the text ``C`` was estimated on) and ``other_keys`` =
    the median over the other keys ``k_j`` of ``|u_S · k_j| / |uᵀk*|``. Returns one row per mask with the
    medians over keys.
    """
    from interp.editing.rome import left_vector
    C64 = C.double()
    eps = eps_rel * float(torch.diagonal(C64).mean())
    K = keys.double()
    masks = [("full", None)] + [(f"tau={t:g}", float(t)) for t in taus]
    per: dict[str, dict[str, list]] = {m: {"rms": [], "other_keys": []} for m, _ in masks}
    for i, k in enumerate(K):
        u, _ = left_vector(C64, k, eps)
        u = u.double()
        uk = float(u @ k).__abs__()
        others = torch.cat([K[:i], K[i + 1:]])
        for name, t in masks:
            uS = u if t is None else u * ((k > 0) & (k >= t))
            per[name]["rms"].append(float((uS @ C64 @ uS).clamp_min(0).sqrt()) / uk)
            if len(others):
                per[name]["other_keys"].append(float((others @ uS).abs().median()) / uk)
    return [{"mask": name, "ridge": eps_rel, "rms_median": float(np.median(v["rms"])),
             "other_keys_median": float(np.median(v["other_keys"])) if v["other_keys"] else float("nan")}
            for name, v in per.items()]


@dataclass
class RealConfig:
    """Validation 3 (defaults: the run of docs/editing.md on ``zoo:smollm2-135m``).

    ``model``: a zoo / hub name, or ``"facts-toy"`` for the recipe's tiny stand-in (the validation-1 facts model
    with its own facts as the relations, its fact texts as the transcoder's and the moments' text).
    Transcoder on MLP ``layer`` (``transcoder``: its training config) from ``max_tokens`` tokens harvested in
    contexts of ``context_size``; second moments from ``n_mom2`` tokens (:func:`moment_texts`); ``n_edits``
    edits of the plan; τ: 0, the rule τ (:func:`tau_for_fraction` at ``tau_frac``) and the ``tau_quantiles``
    of the subjects' active feature values; ``mom2_eps_rel``: a ridge, or ``"auto"`` (:func:`ridge_rule` from
    the diagnostics, fixed before they were computed).
    """

    model: str = "zoo:smollm2-135m"
    layer: int = 8
    transcoder: TranscoderTrainingConfig = field(default_factory=lambda: TranscoderTrainingConfig(
        d_sae=2304, l1_coefficient=6.0, batch_size=256, n_epochs=2, lr=1e-3, resample_every=150, dead_window=50_000))
    context_size: int = 128
    max_tokens: int = 160_000
    n_heldout: int = 24
    n_templates: int = 2
    n_mom2: int = 100_000
    n_edits: int = 20
    tau_quantiles: tuple[float, ...] = (0.5, 0.9)
    tau_frac: float = 0.02
    mom2_eps_rel: str = "auto"
    methods: tuple[str, ...] = ("tcpe", "rome_tc", "rome", "ft")
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mom2_eps_rel != "auto":
            try:
                float(self.mom2_eps_rel)
            except ValueError:
                raise ValueError(f"mom2_eps_rel must be 'auto' or a number (as text), got {self.mom2_eps_rel!r}") from None
        bad = set(self.methods) - {"tcpe", "rome_tc", "rome", "ft"}
        if bad:
            raise ValueError(f"unknown methods {sorted(bad)}: tcpe, rome_tc, rome, ft")


def real_validation(config: RealConfig, stages, model, relations: dict | None = None,
                    documents: Sequence[str] | None = None, heldout: Sequence[str] | None = None,
                    moment_docs: Sequence[str] | None = None, log=None) -> tuple[RealEditComparison, dict]:
    """Validation 3 of TCPE (digest §5) through ``stages`` (:class:`interp.stages.Stages`; every step resumes).

    Stages: ``real-store`` (``blocks.{l}.ln2.hook_normalized`` / ``hook_mlp_out`` harvested from ``documents``
    by :func:`interp.store.harvest`), ``real-transcoder`` (:func:`train_transcoder_from_store`, checkpointed
    beside the stages), ``real-metrics`` (on the held-out text), ``real-setup`` (the subjects' feature
    quantiles, the context templates, the rule τ from the keys of the full plan: every fact both models know,
    so extending ``n_edits`` changes neither), ``real-moments`` (both sites' second moments from one pass and
    their :func:`~interp.editing.rome.moment_diagnostics`), ``real-leak`` (:func:`mask_leak` with the run's ridge
    and without), then one stage per edit and method group
    (:func:`compare_real`). Every τ and the ridge are fixed before any edit is made.

    Defaults for the text (SmolLM2 run): ``documents`` = :func:`training_documents`, ``heldout`` = the first
    ``n_heldout`` lines of Ruth, ``moment_docs`` = :func:`moment_texts` of the documents. Returns the comparison
    and ``{"metrics", "taus", "tau_quantiles", "subject_l0", "tau_rule", "tau_rule_frac", "moments",
    "mom2_eps_rel", "leak"}``.
    """
    from interp.data import heldout_text
    from interp.editing.rome import moment_diagnostics, second_moments
    from interp.editing.transcoders import evaluate_transcoder, train_transcoder_from_store
    from interp.store import harvest

    L = config.layer
    docs = list(documents) if documents is not None else training_documents()
    held = list(heldout) if heldout is not None else \
        [x for x in heldout_text().splitlines() if x.strip()][:config.n_heldout]
    mom_texts = list(moment_docs) if moment_docs is not None else moment_texts(docs, config.n_mom2)
    store = stages.path("real-store", lambda tmp: harvest(
        model, docs, [f"blocks.{L}.ln2.hook_normalized", f"blocks.{L}.hook_mlp_out"], tmp / "store",
        context_size=config.context_size, batch_size=8, dtype="float16", max_tokens=config.max_tokens, shard_mb=32))

    def train(tmp):
        tc, _ = train_transcoder_from_store(store / "store", L, config.transcoder,
                                            checkpoint=stages.folder / "real-transcoder-checkpoint",
                                            checkpoint_every=50)
        tc.save(tmp / "tc")
    tc = Transcoder.load(stages.path("real-transcoder", train) / "tc")
    metrics = stages("real-metrics", lambda: evaluate_transcoder(model, L, tc, held, batch_size=8)
                     .to_frame().to_dict("records")[0])
    if log:
        log(f"transcoder {metrics}")

    def setup():
        qs, l0 = subject_activation_quantiles(model, L, tc, known_facts(model, all_facts(relations))[0],
                                              qs=tuple(config.tau_quantiles))
        # ours (cost): n_templates seed-word templates instead of ROME's 20 sampled from BOS; seeded
        templates = context_templates(model, EditConfig(template_scheme="seed_words", n_templates=config.n_templates))
        _, keys_tc, keys_mlp = plan_keys(model, L, tc, None, templates, relations=relations)
        tau_rule, tau_rule_frac = tau_for_fraction(keys_tc, config.tau_frac)
        return {"quantiles": {str(q): v for q, v in qs.items()}, "subject_l0": l0, "templates": templates,
                "keys_tc": keys_tc, "keys_mlp": keys_mlp, "tau_rule": tau_rule, "tau_rule_frac": tau_rule_frac}
    su = stages("real-setup", setup)
    qs = {float(q): v for q, v in su["quantiles"].items()}

    def moments():
        # ours (cost): n_mom2 TOKENS of passages of <= 128 tokens, not ROME's 100,000 texts (docs/editing.md)
        Cs = second_moments([TranscoderSite(model, L, tc), MLPSite(model, L)], mom_texts, n_tokens=config.n_mom2,
                            max_length=128, n_samples=None)
        diag = {}
        for name, C, keys in (("tc", Cs[0], su["keys_tc"]), ("mlp", Cs[1], su["keys_mlp"])):
            diag[name] = moment_diagnostics(C, keys, eps_rels=(0.0, 1e-2))
            diag[name]["n_keys_active"] = [int((k > 0).sum()) for k in keys] if name == "tc" else \
                [int((k != 0).sum()) for k in keys]
        return {"C_tc": Cs[0], "C_mlp": Cs[1], "diagnostics": diag}
    mo = stages("real-moments", moments)
    eps = ridge_rule(mo["diagnostics"]) if config.mom2_eps_rel == "auto" else float(config.mom2_eps_rel)
    cfg = EditConfig(template_scheme="seed_words", n_templates=config.n_templates, mom2_eps_rel=eps)
    taus = tuple(sorted({0.0, float(su["tau_rule"])} | {round(qs[q], 3) for q in config.tau_quantiles}))
    leak = stages("real-leak", lambda: mask_leak(mo["C_tc"], su["keys_tc"], taus, eps)
                  + (mask_leak(mo["C_tc"], su["keys_tc"], taus, 0.0) if eps else []))
    if log:
        log(f"tau_rule {su['tau_rule']} (mean |S| {su['tau_rule_frac']:.4f} of d_sae), quantiles {qs}, ridge {eps:g}")
    res = compare_real(model, tc, L, n_edits=config.n_edits, taus=taus, config=cfg, methods=tuple(config.methods),
                       heldout=held, C_tc=mo["C_tc"], C_mlp=mo["C_mlp"], seed=config.seed, log=log,
                       templates=su["templates"], relations=relations, stage=stages)
    return res, {"metrics": metrics, "taus": list(taus), "tau_quantiles": su["quantiles"],
                 "subject_l0": su["subject_l0"], "tau_rule": su["tau_rule"], "tau_rule_frac": su["tau_rule_frac"],
                 "moments": mo["diagnostics"], "mom2_eps_rel": eps, "leak": leak}


def _null():
    import contextlib
    return contextlib.nullcontext()


__all__ = ["RELATIONS", "Fact", "all_facts", "training_documents", "subject_activation_quantiles", "known_facts", "top1",
           "perplexity", "RealEditComparison", "edit_plan", "compare_real", "RealConfig", "real_validation", "mask_leak",
           "moment_texts",
           "plan_keys", "tau_for_fraction", "ridge_rule"]
