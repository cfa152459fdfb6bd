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

from .rome import EditConfig, EditRequest, FineTuneConfig, MLPSite, TranscoderSite, context_templates, fine_tune, \
    rank_one, restrict, second_moment
from .transcoders import Transcoder, splice

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
    """Token-weighted perplexity of ``texts``."""
    from interp.model import next_token_loss
    tot = n = 0.0
    for i in range(0, len(texts), batch_size):
        batch = model.prepare(model.tokenize(list(texts[i:i + batch_size]), max_length=max_length))
        w = float((batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1]).sum())
        tot += float(next_token_loss(model(batch), batch)) * w
        n += w
    return float(np.exp(tot / max(n, 1)))


@dataclass
class RealEditComparison(TableResult):
    """Per (method, edit): efficacy, paraphrase, neighbourhood, perplexity, rows changed."""

    kind = "real_edit_comparison"
    def summary(self):
        return self.to_frame().groupby("method").agg(
            efficacy=("efficacy", "mean"), paraphrase=("paraphrase", "mean"), neighbourhood=("neighbourhood", "mean"),
            ppl_before=("ppl_before", "mean"), ppl_after=("ppl_after", "mean"), n_changed=("n_changed", "mean"),
            frac_changed=("frac_changed", "mean"), residual=("residual", "mean"), final_nll=("final_nll", "mean"),
            n=("efficacy", "size")).reset_index()

    def figure(self):
        import plotly.express as px
        s = self.summary()
        return px.bar(s.melt(id_vars="method", value_vars=["efficacy", "paraphrase", "neighbourhood"]), x="variable",
                      y="value", color="method", barmode="group", title="single-fact edits")


def compare_real(model, transcoder: Transcoder, layer: int, n_edits: int = 10, taus: Sequence[float] = (0.5,),
                 config: EditConfig | None = None, ft_config: FineTuneConfig | None = None,
                 context_texts: Sequence[str] = (), heldout: Sequence[str] = (), n_mom2: int = 20_000,
                 seed: int = 0, methods: Sequence[str] = ("tcpe", "rome_tc", "rome", "ft"),
                 log=None) -> RealEditComparison:
    """Edit ``n_edits`` known facts of ``model`` (each to another object of its relation) with every method.

    ``context_texts``: real text for the second moments (``n_mom2`` tokens); ``heldout``: texts for the
    perplexity. TCPE's masks share one unmasked ``compute_v`` (:func:`~.rome.restrict`).
    """
    cfg = config or EditConfig()
    ft_cfg = ft_config or FineTuneConfig()
    rng = np.random.default_rng(seed)
    known, _ = known_facts(model)
    with splice(model, layer, transcoder):
        known_tc, _ = known_facts(model, known)
        ppl_tc = perplexity(model, heldout)
    ppl = perplexity(model, heldout)
    both = [f for f in known if f in set(known_tc)]
    picks = [both[i] for i in rng.choice(len(both), size=min(n_edits, len(both)), replace=False)]
    templates = context_templates(model, cfg)
    out = RealEditComparison(baseline={"n_facts": len(all_facts()), "known": len(known), "known_spliced": len(known_tc),
                                       "ppl": ppl, "ppl_spliced": ppl_tc, "templates": templates, "layer": layer})
    if log:
        log(f"baseline {out.baseline}")
    C_mlp = second_moment(MLPSite(model, layer), context_texts, n_tokens=n_mom2) if {"rome"} & set(methods) else None
    tc_site = TranscoderSite(model, layer, transcoder)
    C_tc = second_moment(tc_site, context_texts, n_tokens=n_mom2) if {"tcpe", "rome_tc"} & set(methods) else None
    for f in progress(picks, desc="edits"):
        objs = sorted({o for s, o in RELATIONS[f.relation][2].items()} - {f.obj})
        new = objs[int(rng.integers(len(objs)))]
        req = f.request(new)
        tgt = _first(model, new)
        full = None
        for method in methods:
            for tau in (taus if method == "tcpe" else (None,)):
                if method == "rome":
                    e = rank_one(MLPSite(model, layer), req, C_mlp, cfg, method="rome", templates=templates)
                    e.apply(model)
                elif method == "ft":
                    e = fine_tune(model, req, layer, ft_cfg, templates=templates[:1])
                else:
                    if full is None:
                        full = rank_one(tc_site, req, C_tc, cfg, tau=-1.0, method="rome_tc", templates=templates)
                    e = full if method == "rome_tc" else restrict(full, tau, site=tc_site)
                    e.apply(transcoder=transcoder)
                tc_on = e.site == "transcoder"
                ref = known_tc if tc_on else known
                others = [g for g in ref if g.subject != f.subject]
                with (splice(model, layer, transcoder) if tc_on else _null()):
                    p = top1(model, [f.prompt, f.paraphrase] + [g.prompt for g in others])
                    ppl_after = perplexity(model, heldout)
                e.revert(transcoder=transcoder) if tc_on else e.revert(model)
                neigh = np.mean([pi == _first(model, g.obj) for pi, g in zip(p[2:], others)])
                row = {"method": method if tau is None else f"tcpe(tau={tau})", "relation": f.relation,
                       "subject": f.subject, "old": f.obj, "new": new, "efficacy": float(p[0] == tgt),
                       "paraphrase": float(p[1] == tgt), "neighbourhood": float(neigh), "n_neighbours": len(others),
                       "ppl_before": ppl_tc if tc_on else ppl, "ppl_after": ppl_after, "n_changed": e.n_changed,
                       "d_key": e.d_key, "frac_changed": e.n_changed / e.d_key, "residual": e.residual,
                       "final_nll": e.log["nll"][-1] if e.log.get("nll") else float("nan")}
                out.rows.append(row)
                if log:
                    log(str(row))
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


def _null():
    import contextlib
    return contextlib.nullcontext()


__all__ = ["RELATIONS", "Fact", "all_facts", "training_documents", "subject_activation_quantiles", "known_facts", "top1", "perplexity", "RealEditComparison", "compare_real"]
