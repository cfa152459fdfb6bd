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

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from interp.progress import progress
from interp.results import TableResult

from interp.editing.rome import EditConfig, EditRequest, FineTuneConfig, MLPSite, TranscoderSite, context_templates, fine_tune, \
    rank_one, restrict, second_moment
from interp.editing.transcoders import Transcoder, splice

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
    relation: str
    subject: str
    obj: str

    @property
    def prompt(self) -> str:
        return RELATIONS[self.relation][0].format(self.subject)

    @property
    def paraphrase(self) -> str:
        return RELATIONS[self.relation][1].format(self.subject)

    def request(self, target: str) -> EditRequest:
        return EditRequest(RELATIONS[self.relation][0], self.subject, target)


def all_facts() -> list[Fact]:
    return [Fact(r, s, o) for r, (_, _, table) in RELATIONS.items() for s, o in table.items()]


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


def edit_plan(both: Sequence[Fact], n_edits: int, seed: int = 0) -> list[tuple[Fact, str]]:
    """The first ``n_edits`` of a fixed random order of ``both``, each with a new object of its relation drawn
    by its own generator (``seed``, index): a larger ``n_edits`` extends the plan without changing its start."""
    order = np.random.default_rng(seed).permutation(len(both))
    out = []
    for i in order[:n_edits]:
        f = both[int(i)]
        objs = sorted({o for o in RELATIONS[f.relation][2].values()} - {f.obj})
        out.append((f, objs[int(np.random.default_rng([seed, int(i)]).integers(len(objs)))]))
    return out


def compare_real(model, transcoder: Transcoder, layer: int, n_edits: int = 10, taus: Sequence[float] = (0.5,),
                 config: EditConfig | None = None, ft_config: FineTuneConfig | None = None,
                 context_texts: Sequence[str] = (), heldout: Sequence[str] = (), n_mom2: int = 20_000,
                 seed: int = 0, methods: Sequence[str] = ("tcpe", "rome_tc", "rome", "ft"),
                 log=None, run_dir: str | None = None, reverse: bool = False,
                 templates: Sequence[str] | None = None, mom2_dir: str | None = None) -> RealEditComparison:
    """Edit ``n_edits`` known facts of ``model`` (each to another object of its relation, :func:`edit_plan`)
    with every method, each edit applied alone and reverted.

    ``context_texts``: real text for the second moments (``n_mom2`` tokens); ``heldout``: texts for the
    perplexity. TCPE's masks share one unmasked ``compute_v`` (:func:`~.rome.restrict`).

    ``run_dir``: resumable run folder. ``setup.json`` (baseline, plan, templates), the second moments
    (``mom2_mlp.safetensors``, ``mom2_tc.safetensors``) and, per edit and method group (``tc``: TCPE's taus and
    ROME on the transcoder; ``rome``; ``ft``), ``edit_{i:03d}_{group}.json`` are written atomically as they
    complete; a rerun with the same arguments reads them and computes only what is missing (a run with a
    different layer, taus, seed or config is refused). Each file is checked again just before its
    group is computed, so a second process on the same ``run_dir`` with ``reverse=True`` (the plan from its
    end) shares the work; rows are returned in plan order. ``methods`` is not part of the run's identity: a
    later call with another method (e.g. ``"ft"``) adds its files to the same folder.

    ``templates``: the context templates (default: sampled by :func:`~.rome.context_templates`; a resumed run
    uses its stored ones). ``mom2_dir``: folder of the second-moment files (default ``run_dir``). TCPE masks
    with the same rows (e.g. two τ that keep the same features of ``k*``) have the same update and are evaluated
    once.
    """
    from pathlib import Path
    from interp.io import atomic_write_json, load_json
    cfg = config or EditConfig()
    ft_cfg = ft_config or FineTuneConfig()
    rd = Path(run_dir) if run_dir is not None else None
    ident = {"layer": layer, "taus": [float(t) for t in taus], "seed": seed,
             "config": {k: v for k, v in vars(cfg).items()}, "ft_config": vars(ft_cfg), "n_mom2": n_mom2,
             "n_heldout": len(heldout), "n_context": len(context_texts)}
    ident = __import__("json").loads(__import__("json").dumps(ident))
    setup = None
    if rd is not None and (rd / "setup.json").is_file():
        setup = load_json(rd / "setup.json", what="real-edit run", required=("ident", "baseline"))
        if setup["ident"] != ident:
            raise ValueError(f"{rd} holds a run with other arguments: {setup['ident']} != {ident}")
    known, _ = known_facts(model)
    with splice(model, layer, transcoder):
        known_tc, _ = known_facts(model, known)
        pred_tc = top1(model, [g.prompt for g in known])  # spliced model's answers before any edit
        ppl_tc = setup["baseline"]["ppl_spliced"] if setup else perplexity(model, heldout)
    ppl = setup["baseline"]["ppl"] if setup else perplexity(model, heldout)
    both = [f for f in known if f in set(known_tc)]
    templates = setup["baseline"]["templates"] if setup else \
        (list(templates) if templates is not None else context_templates(model, cfg))
    out = RealEditComparison(baseline={"n_facts": len(all_facts()), "known": len(known), "known_spliced": len(known_tc),
                                       "ppl": ppl, "ppl_spliced": ppl_tc, "templates": templates, "layer": layer})
    if rd is not None and setup is None:
        rd.mkdir(parents=True, exist_ok=True)
        atomic_write_json(rd / "setup.json", {"ident": ident, "baseline": out.baseline})
    if log:
        log(f"baseline {out.baseline}")
    groups = [g for g in ("tc", "rome", "ft") if (g == "tc" and {"tcpe", "rome_tc"} & set(methods)) or g in methods]
    plan = edit_plan(both, n_edits, seed)
    todo = [(i, g) for i in range(len(plan)) for g in groups
            if rd is None or not (rd / f"edit_{i:03d}_{g}.json").is_file()]
    md = Path(mom2_dir) if mom2_dir is not None else rd
    if md is not None:
        md.mkdir(parents=True, exist_ok=True)
    mom = (lambda name: str(md / f"mom2_{name}.safetensors")) if md is not None else (lambda name: None)
    tc_site = TranscoderSite(model, layer, transcoder)
    C_mlp = second_moment(MLPSite(model, layer), context_texts, n_tokens=n_mom2, cache_file=mom("mlp")) \
        if any(g == "rome" for _, g in todo) else None
    C_tc = second_moment(tc_site, context_texts, n_tokens=n_mom2, cache_file=mom("tc")) \
        if any(g == "tc" for _, g in todo) else None
    results: dict = {}
    order = list(range(len(plan)))[::-1] if reverse else list(range(len(plan)))
    for i in progress(order, desc="edits"):
        f, new = plan[i]
        req = f.request(new)
        tgt = _first(model, new)
        for g in groups:
            path = rd / f"edit_{i:03d}_{g}.json" if rd is not None else None
            if path is not None and path.is_file():
                results[i, g] = load_json(path, what="real-edit result", required=("rows",))["rows"]
                continue
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
                    e.apply(transcoder=transcoder) if tc_on else e.apply(model)
                    try:
                        with (splice(model, layer, transcoder) if tc_on else _null()):
                            p = top1(model, [f.prompt, f.paraphrase] + [known[j].prompt for j in others])
                            ppl_after = perplexity(model, heldout)
                    finally:
                        e.revert(transcoder=transcoder) if tc_on else e.revert(model)
                    if same is not None:
                        seen[same] = (p, ppl_after)
                ref = set(known_tc) if tc_on else set(known)
                before = pred_tc if tc_on else [_first(model, h.obj) for h in known]
                neigh = [pi == _first(model, known[j].obj) for pi, j in zip(p[2:], others) if known[j] in ref]
                loc = [pi == before[j] for pi, j in zip(p[2:], others)]
                row = {"edit": i, "method": e.method if e.method != "tcpe" else f"tcpe(tau={e.tau})",
                       "relation": f.relation, "subject": f.subject, "old": f.obj, "new": new,
                       "efficacy": float(p[0] == tgt), "paraphrase": float(p[1] == tgt),
                       "neighbourhood": float(np.mean(neigh)), "n_neighbours": len(neigh),
                       "locality": float(np.mean(loc)), "n_locality": len(loc),
                       "ppl_before": ppl_tc if tc_on else ppl, "ppl_after": ppl_after, "n_changed": e.n_changed,
                       "d_key": e.d_key, "frac_changed": e.n_changed / e.d_key, "residual": e.residual,
                       "final_nll": e.log["nll"][-1] if e.log.get("nll") else float("nan"),
                       "cos_uk": e.log.get("cos_uk", float("nan"))}
                rows.append(row)
                if log:
                    log(str(row))
            results[i, g] = rows
            if path is not None:
                atomic_write_json(path, {"rows": rows})
    out.rows.extend(r for i in range(len(plan)) for g in groups for r in results.get((i, g), []))
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


def load_run(run_dir: str) -> RealEditComparison:
    """The results a :func:`compare_real` ``run_dir`` holds so far (finished edits and method groups, in plan
    order), without a model; ``baseline`` adds ``n_edits_complete`` (edits with every group written)."""
    from pathlib import Path
    from interp.io import load_json
    rd = Path(run_dir)
    setup = load_json(rd / "setup.json", what="real-edit run", required=("ident", "baseline"))
    files = sorted(rd.glob("edit_*_*.json"))
    out = RealEditComparison(baseline=dict(setup["baseline"]))
    per: dict = {}
    for f in files:
        i = int(f.stem.split("_")[1])
        per.setdefault(i, []).append(f)
        out.rows.extend(load_json(f, what="real-edit result", required=("rows",))["rows"])
    n_groups = len({f.stem.split("_", 2)[2] for f in files})  # the method groups this folder holds
    out.baseline["n_edits_complete"] = sum(len(v) == n_groups for v in per.values())
    out.rows.sort(key=lambda r: r["edit"])
    return out


def moment_texts(docs: Sequence[str], n_tokens: int) -> list[str]:
    """The real text of the second moments: for ``n_tokens ≤ 8000`` the 75 passages ``docs[1700:1775]`` of the
    earlier runs (truncated to 128 tokens each: ~9,600 tokens); above, every passage from ``docs[1700]`` on split
    into its two halves (6 verses / 3 instructions each, ~1,300 pieces of ≤ 128 tokens, ~150k tokens), so that
    ``n_tokens`` = 100,000 (ROME's ``mom2_n_samples``) is reached. None of it is in the transcoder's training
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
              seed: int = 0, fact_token: str = "subject_last"):
    """The edit plan of :func:`compare_real` (facts both the plain and the spliced model know, :func:`edit_plan`)
    and the keys ``k*`` of its requests at both sites, before any edit: ``(plan, keys_tc [n, d_sae],
    keys_mlp [n, d_mlp])``. ``n_edits=None``: the full plan (every fact both know), whose start is the plan of
    any ``n_edits``."""
    from interp.editing.rome import compute_key
    known, _ = known_facts(model)
    with splice(model, layer, transcoder):
        known_tc, _ = known_facts(model, known)
    both = [f for f in known if f in set(known_tc)]
    plan = edit_plan(both, len(both) if n_edits is None else n_edits, seed)
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
    """The ridge of :func:`validate_real` from the second-moment diagnostics (rule fixed before they were
    computed): 0 if the transcoder's ``C`` has at most ``tiny_ok`` eigenvalues below 1e-6 · mean(diag C) on the
    features active in the text and the median ``cos(u, k*)`` without ridge over the plan's keys is at least
    ``cos_ratio`` times the MLP site's (ROME's own site); otherwise ``ridge`` (the earlier runs' 1e-2)."""
    tc, mlp = moments["tc"], moments["mlp"]
    ok = tc["n_tiny_active"] <= tiny_ok and \
        float(np.median(tc["cos_uk_ridge0"])) >= cos_ratio * float(np.median(mlp["cos_uk_ridge0"]))
    return 0.0 if ok else ridge


def validate_real(cache_dir: str, n_edits: int = 20, layer: int = 8, n_templates: int = 2, n_mom2: int = 100_000,
                  tau_quantiles: Sequence[float] = (0.5, 0.9), tau_frac: float = 0.02,
                  mom2_eps_rel: float | str = "auto",
                  methods: Sequence[str] = ("tcpe", "rome_tc", "rome"), log=None,
                  reverse: bool = False) -> tuple[RealEditComparison, dict]:
    """Validation 3 of TCPE (digest §5) on ``zoo:smollm2-135m``, resumable in ``cache_dir``.

    Steps (each cached in ``cache_dir``): harvest ``blocks.{l}.ln2.hook_normalized`` / ``hook_mlp_out`` on
    :func:`training_documents` (160k tokens, ``store_L{l}``, :func:`interp.store.harvest` resumes); train the
    transcoder (d_sae 2304, L1 6.0, 2 epochs, checkpoint ``tc_ckpt_L{l}``, result ``tc_L{l}`` in sae-lens
    format); its metrics on held-out text (``tc_metrics_L{l}.json``); the edit plan's keys and the second
    moments of both sites from ``n_mom2`` tokens of :func:`moment_texts` (``mom2_L{l}_n{n_mom2}/``, with
    :func:`~.rome.moment_diagnostics` of both in ``diagnostics.json``; the keys of the diagnostics and of the τ
    rule are those of the full plan, every fact both models know, so extending ``n_edits`` changes neither);
    TCPE's τ sweep; then :func:`compare_real` with
    ``run_dir = cache_dir/edits_L{l}[_n{n_mom2}][_ridge{mom2_eps_rel}]`` (one file per edit and method group;
    ``reverse``: a second worker).

    **τ** (every value fixed before any edit is made): 0 (all of ``k*``'s features), the **rule τ**
    ``tau_frac`` (:func:`tau_for_fraction`: the smallest τ whose mean mask over the full plan's keys is ≤ 2% of
    d_sae, the middle of the digest's "|S| ≈ 1–3% of d_tc"; the configuration the goal is judged on), and the
    ``tau_quantiles`` of the active feature values at the subjects' last tokens (:func:`subject_activation_quantiles`;
    0.9 is the earlier runs' τ).

    ``mom2_eps_rel``: ridge ``C + mom2_eps_rel · mean(diag C) · I`` for both sites. With ``n_mom2 = 8000`` (the
    earlier runs) ``C`` of the transcoder was singular and ``u = C⁻¹k*`` nearly orthogonal to ``k*`` without
    it (``cos_uk`` 0.05, −0.004; MLP site 0.53), hence 1e-2 there. ``"auto"`` (default) decides from
    ``diagnostics.json`` by a rule fixed before it was computed (:func:`ridge_rule`): no ridge if the
    transcoder's ``C`` on the features active in the text has no eigenvalue below 1e-6 · mean(diag C) and the
    median ``cos_uk`` without ridge over the plan's keys is at least half the MLP site's; otherwise 1e-2.
    ``mom2_eps_rel=0`` reproduces an unregularised run. ``methods``: FT-L (``"ft"``) does not depend on ``C``,
    τ or the transcoder and is not in the default methods; ``methods=("ft",)`` extends a run folder with it
    (the validation-3 folder of docs/editing.md holds all four methods of the 20-edit plan).
    Returns the comparison and ``{"metrics", "taus", "tau_quantiles", "subject_l0", "tau_rule",
    "tau_rule_frac", "moments", "mom2_eps_rel"}``.
    """
    from pathlib import Path

    import interp
    from interp.data import heldout_text
    from interp.io import atomic_write_json, load_json
    from interp.store import harvest

    from interp.editing.rome import moment_diagnostics, second_moments
    from interp.editing.transcoders import TranscoderTrainingConfig, evaluate_transcoder, train_transcoder_from_store
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    model = interp.load("zoo:smollm2-135m")
    docs = training_documents()
    tc_path = cache / f"tc_L{layer}"
    if (tc_path / "cfg.json").is_file():
        tc = Transcoder.load(tc_path)
    else:
        store = cache / f"store_L{layer}"
        harvest(model, docs, [f"blocks.{layer}.ln2.hook_normalized", f"blocks.{layer}.hook_mlp_out"], store,
                context_size=128, batch_size=8, dtype="float16", max_tokens=160_000, shard_mb=32)
        tc, _ = train_transcoder_from_store(store, layer, TranscoderTrainingConfig(
            d_sae=2304, l1_coefficient=6.0, batch_size=256, n_epochs=2, lr=1e-3, resample_every=150,
            dead_window=50_000), checkpoint=cache / f"tc_ckpt_L{layer}", checkpoint_every=50)
        tc.save(tc_path)
    held = [x for x in heldout_text().splitlines() if x.strip()][:24]
    mpath = cache / f"tc_metrics_L{layer}.json"
    if mpath.is_file():
        metrics = load_json(mpath, what="transcoder metrics")
    else:
        metrics = evaluate_transcoder(model, layer, tc, held, batch_size=8).to_frame().to_dict("records")[0]
        atomic_write_json(mpath, metrics)
    if log:
        log(f"transcoder {metrics}")
    qs, l0 = subject_activation_quantiles(model, layer, tc, known_facts(model)[0], qs=tuple(tau_quantiles))
    templates = context_templates(model, EditConfig(n_templates=n_templates))  # seeded: the same in every run
    texts = moment_texts(docs, n_mom2)
    mdir = cache / f"mom2_L{layer}_n{n_mom2}"
    mdir.mkdir(parents=True, exist_ok=True)
    # the rule's keys: the full plan (every fact both models know), so that a run extended to more edits keeps its
    # τ sweep and ridge (the plan of any n_edits is its start)
    _, keys_tc, keys_mlp = plan_keys(model, layer, tc, None, templates)
    tau_rule, tau_rule_frac = tau_for_fraction(keys_tc, tau_frac)
    dpath = mdir / "diagnostics.json"
    if dpath.is_file():
        moments = load_json(dpath, what="second-moment diagnostics")
    else:
        moments = {}
        Cs = second_moments([TranscoderSite(model, layer, tc), MLPSite(model, layer)], texts, n_tokens=n_mom2,
                            cache_files=[str(mdir / "mom2_tc.safetensors"), str(mdir / "mom2_mlp.safetensors")])
        for name, C, keys in (("tc", Cs[0], keys_tc), ("mlp", Cs[1], keys_mlp)):
            moments[name] = moment_diagnostics(C, keys, eps_rels=(0.0, 1e-2))
            moments[name]["n_keys_active"] = [int((k > 0).sum()) for k in keys] if name == "tc" else \
                [int((k != 0).sum()) for k in keys]
        atomic_write_json(dpath, moments)
    eps = ridge_rule(moments) if mom2_eps_rel == "auto" else float(mom2_eps_rel)
    cfg = EditConfig(n_templates=n_templates, mom2_eps_rel=eps)
    suffix = (f"_n{n_mom2}" if n_mom2 != 8000 else "") + (f"_ridge{eps:g}" if eps else "")
    run_dir = cache / f"edits_L{layer}{suffix}"
    if log:
        log(f"tau_rule {tau_rule} (mean |S| {tau_rule_frac:.4f} of d_sae), quantiles {qs}, ridge {eps:g}")
    taus = tuple(sorted({0.0, tau_rule} | {round(qs[q], 3) for q in tau_quantiles}))
    res = compare_real(model, tc, layer, n_edits=n_edits, taus=taus, config=cfg, methods=tuple(methods),
                       context_texts=texts, heldout=held, n_mom2=n_mom2, log=log, run_dir=str(run_dir),
                       reverse=reverse, templates=templates, mom2_dir=str(mdir))
    return res, {"metrics": metrics, "taus": taus, "tau_quantiles": qs, "subject_l0": l0, "tau_rule": tau_rule,
                 "tau_rule_frac": tau_rule_frac, "moments": moments, "mom2_eps_rel": eps}


def _null():
    import contextlib
    return contextlib.nullcontext()


__all__ = ["RELATIONS", "Fact", "all_facts", "training_documents", "subject_activation_quantiles", "known_facts", "top1",
           "perplexity", "RealEditComparison", "edit_plan", "compare_real", "load_run", "validate_real", "moment_texts",
           "plan_keys", "tau_for_fraction", "ridge_rule"]
