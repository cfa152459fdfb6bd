"""TCPE reproduction, validation 1 — the digest's CPU recipe (§5): a 2-layer model trained on 200 synthetic
facts, and the side-by-side evaluation of knowledge edits on it (TCPE, ROME on the transcoder, ROME on the MLP, constrained fine-tuning).

Facts: 50 subjects ``s0..s49`` × 4 relations ``r0..r3`` → objects ``o0..o29`` (drawn uniformly, seed 0).
Each relation has a paraphrase token ``p0..p3`` trained on the same facts (paraphrase generalisation).
Training text: ``<bos> s r o . s' r' o' . ...`` (1–4 facts per sequence, either surface form), loss on
every position. A word-level tokenizer (one token per word) keeps subjects and objects single tokens.
"""
from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from interp.progress import progress
from interp.results import TableResult

from interp.editing.rome import EditConfig, EditRequest, FineTuneConfig, MLPSite, TranscoderSite, context_templates, \
    fine_tune, rome, second_moment, tcpe
from interp.editing.transcoders import Transcoder, splice

N_SUBJ, N_REL, N_OBJ = 50, 4, 30
EXTRA_WORDS = (".", "is", "a", "The", "Therefore", "Because", "I", "You")


@dataclass
class FactsTask:
    """The facts (``objects[s, r]``), prompts and text generators of the recipe."""

    seed: int = 0
    objects: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.objects = np.random.default_rng(self.seed).integers(0, N_OBJ, size=(N_SUBJ, N_REL))

    def words(self) -> list[str]:
        return ([f"s{i}" for i in range(N_SUBJ)] + [f"r{i}" for i in range(N_REL)] + [f"p{i}" for i in range(N_REL)]
                + [f"o{i}" for i in range(N_OBJ)] + list(EXTRA_WORDS))

    def prompt(self, s: int, r: int, paraphrase: bool = False) -> str:
        return f"s{s} {'p' if paraphrase else 'r'}{r}"

    def request(self, s: int, r: int, new_object: int) -> EditRequest:
        return EditRequest(f"{{}} r{r}", f"s{s}", f" o{new_object}")

    def texts(self, n: int, seed: int) -> list[str]:
        """``n`` training/context sequences of 1–4 random facts."""
        rng = random.Random(seed)
        out = []
        for _ in range(n):
            parts = []
            for _ in range(rng.randint(1, 4)):
                s, r = rng.randrange(N_SUBJ), rng.randrange(N_REL)
                parts.append(f"{self.prompt(s, r, rng.random() < 0.5)} o{self.objects[s, r]}")
            out.append(" . ".join(parts))
        return out


def word_tokenizer(words: Sequence[str]):
    """A word-level tokenizer over ``words`` plus ``<pad> <bos> <eos> <unk>`` (ids 0-3); ``<bos>`` is prepended,
    decoding joins words with spaces (no space before ``.``), padding on the right
    (:func:`interp.training.word_level_tokenizer`)."""
    from interp.training import SPECIALS, word_level_tokenizer

    tok = word_level_tokenizer([*SPECIALS, *words], cleanup=True)
    tok.padding_side = "right"
    return tok


def facts_tokenizer(task: FactsTask):
    """A word-level tokenizer over the task's words (plus ``<bos> <eos> <pad> <unk>``)."""
    return word_tokenizer(task.words())


def word_lm(tok, d_model: int, d_mlp: int, n_layers: int, n_positions: int, seed: int = 0):
    """The untrained GPT-2-style LM of the toys (4 heads, dropout off, trained LayerNorms) over ``tok``'s
    vocabulary (a ``transformers`` model; weights seeded by ``seed``)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=n_positions, n_embd=d_model, n_layer=n_layers, n_head=4,
                     n_inner=d_mlp, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)


def train_word_lm(tok, texts: Callable[[int, int], list[str]], steps: int, seed: int, d_model: int, d_mlp: int,
                  n_layers: int, lr: float, batch: int, n_positions: int, desc: str):
    """Train :func:`word_lm` on ``texts(batch, step_seed)`` with the loss on every real position
    (:func:`interp.training.train_lm`: AdamW betas (0.9, 0.999), torch's one-cycle schedule with
    ``pct_start`` 0.05, no gradient clipping); returns the interp Model (torch backend)."""
    import interp
    from interp.training import LMTrainConfig, train_lm

    hf = word_lm(tok, d_model, d_mlp, n_layers, n_positions, seed)

    def batches():
        for step in range(steps):
            enc = tok(texts(batch, seed * 100_003 + step), return_tensors="pt", padding=True)
            yield {**enc, "labels": enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)}

    train_lm(hf, batches(), LMTrainConfig(steps=steps, lr=lr, weight_decay=0.01, betas=(0.9, 0.999), clip=None,
                                          schedule="one_cycle", pct_start=0.05), desc=desc)
    return interp.wrap(hf, tok, backend="torch")


def facts_relations(task: "FactsTask") -> dict:
    """The task's facts as relations ``{"r<r>": ("{} r<r>", "{} p<r>", {"s<s>": " o<o>"})}`` (the form of
    :data:`~interp.benchmarks.tcpe.real_facts.RELATIONS`)."""
    return {f"r{r}": ("{} r%d" % r, "{} p%d" % r, {f"s{s}": f" o{int(task.objects[s, r])}" for s in range(N_SUBJ)})
            for r in range(N_REL)}


def train_facts_model(task: FactsTask | None = None, steps: int = 3000, seed: int = 0, d_model: int = 64,
                      d_mlp: int = 256, n_layers: int = 2, lr: float = 3e-3, batch: int = 128):
    """Train the recipe's GPT-2-style model (``n_layers``, ``d_model``, ``d_mlp``) on the facts; returns
    ``(interp Model, task)``."""
    task = task or FactsTask(seed)
    model = train_word_lm(facts_tokenizer(task), task.texts, steps, seed, d_model, d_mlp, n_layers, lr, batch,
                          n_positions=32, desc="facts model")
    return model, task


@contextlib.contextmanager
def applied(edit, model, transcoder: Transcoder | None = None):
    """``edit`` applied for the block and reverted after it (also on an error). An edit that changes no row (a
    TCPE mask above every key value) is a no-op: nothing is written."""
    if edit.n_changed == 0:
        yield edit
        return
    on_tc = edit.site == "transcoder"
    edit.apply(transcoder=transcoder) if on_tc else edit.apply(model)
    try:
        yield edit
    finally:
        edit.revert(transcoder=transcoder) if on_tc else edit.revert(model)


@torch.no_grad()
def fact_predictions(model, task: FactsTask, paraphrase: bool = False) -> np.ndarray:
    """Top-1 object index predicted for every (subject, relation): ``[N_SUBJ, N_REL]`` (-1 if not an object)."""
    prompts = [task.prompt(s, r, paraphrase) for s in range(N_SUBJ) for r in range(N_REL)]
    logits = model(prompts)[:, -1]  # all prompts have the same length (2 words + bos)
    obj_ids = torch.tensor([model.to_single_token(f"o{i}") for i in range(N_OBJ)])
    top = logits.argmax(-1)
    pos = (top[:, None] == obj_ids[None]).float()
    pred = torch.where(pos.any(1), pos.argmax(1), torch.full_like(top, -1))
    return pred.numpy().reshape(N_SUBJ, N_REL)


@dataclass
class FactsComparison(TableResult):
    """Per (method, edit) outcome of the recipe: efficacy, paraphrase, neighbourhood and other-fact accuracy."""

    kind = "facts_edit_comparison"
    def summary(self):
        df = self.to_frame()
        return df.groupby("method").agg(efficacy=("efficacy", "mean"), paraphrase=("paraphrase", "mean"),
                                        neighbourhood=("neighbourhood", "mean"), other_acc=("other_acc", "mean"),
                                        other_drop=("other_drop", "mean"), n_changed=("n_changed", "mean"),
                                        mask_frac=("frac_changed", "mean"), residual=("residual", "mean")).reset_index()

    def figure(self):
        import plotly.express as px
        s = self.summary()
        return px.bar(s.melt(id_vars="method", value_vars=["efficacy", "paraphrase", "neighbourhood", "other_acc"]),
                      x="variable", y="value", color="method", barmode="group", title="knowledge edits on the facts model")


def compare_methods(model, task: FactsTask, transcoder: Transcoder, layer: int = 0, n_edits: int = 20,
                    taus: Sequence[float] = (0.5,), config: EditConfig | None = None,
                    ft_config: FineTuneConfig | None = None, n_context: int = 2000, seed: int = 0,
                    methods: Sequence[str] = ("tcpe", "rome_tc", "rome", "ft")) -> FactsComparison:
    """Edit ``n_edits`` facts (each to a new object, one at a time, reverted after) with every method.

    The spliced model (transcoder in place of MLP ``layer``, no error term) is the unedited reference for the
    transcoder methods, the plain model for ``rome`` and ``ft``. ``other_acc``: accuracy on the other 199
    facts w.r.t. the original objects; ``other_drop`` = reference accuracy − ``other_acc``.
    """
    cfg = config or EditConfig()
    ft_cfg = ft_config or FineTuneConfig()
    rng = np.random.default_rng(seed)
    ctx = task.texts(n_context, seed=10_000 + seed)
    templates = context_templates(model, cfg)
    base = fact_predictions(model, task)
    with splice(model, layer, transcoder):
        base_tc = fact_predictions(model, task)
    truth = task.objects
    C_mlp = second_moment(MLPSite(model, layer), ctx)
    C_tc = second_moment(TranscoderSite(model, layer, transcoder), ctx)
    cands = [(s, r) for s in range(N_SUBJ) for r in range(N_REL) if base[s, r] == truth[s, r] == base_tc[s, r]]
    picks = [cands[i] for i in rng.choice(len(cands), size=min(n_edits, len(cands)), replace=False)]
    out = FactsComparison(baseline={"acc": float((base == truth).mean()), "acc_spliced": float((base_tc == truth).mean()),
                                    "acc_paraphrase": float((fact_predictions(model, task, True) == truth).mean()),
                                    "templates": templates})
    for s, r in progress(picks, desc="edits"):
        new = int((truth[s, r] + 1 + rng.integers(0, N_OBJ - 1)) % N_OBJ)
        req = task.request(s, r, new)
        other = np.ones_like(truth, dtype=bool)
        other[s, r] = False
        neigh = np.zeros_like(other)
        neigh[:, r] = True
        neigh[s, r] = False
        for method in methods:
            for tau in (taus if method == "tcpe" else (None,)):
                if method == "rome":
                    e = rome(model, req, layer, C=C_mlp, config=cfg, templates=templates, apply=False)
                elif method == "ft":
                    e = fine_tune(model, req, layer, ft_cfg, templates=templates[:1], apply=False)
                else:
                    e = tcpe(model, req, layer, transcoder, tau=-1.0 if method == "rome_tc" else tau, C=C_tc,
                             config=cfg, templates=templates, apply=False)
                ref = base_tc if e.site == "transcoder" else base
                with applied(e, model, transcoder):
                    with (splice(model, layer, transcoder) if e.site == "transcoder" else contextlib.nullcontext()):
                        pred, para = fact_predictions(model, task), fact_predictions(model, task, True)
                acc_other = float((pred[other] == truth[other]).mean())
                out.rows.append({"method": method if tau is None else f"tcpe(tau={tau})", "subject": s, "relation": r,
                                 "new_object": new, "efficacy": float(pred[s, r] == new),
                                 "paraphrase": float(para[s, r] == new),
                                 "neighbourhood": float((pred[neigh] == truth[neigh]).mean()),
                                 "other_acc": acc_other,
                                 "other_drop": float((ref[other] == truth[other]).mean()) - acc_other,
                                 "n_changed": e.n_changed, "n_active": e.n_active, "d_key": e.d_key,
                                 "frac_changed": e.n_changed / e.d_key, "residual": e.residual,
                                 "final_nll": e.log["nll"][-1] if e.log.get("nll") else float("nan")})
    return out


__all__ = ["FactsTask", "applied", "word_tokenizer", "facts_tokenizer", "word_lm", "train_word_lm", "facts_relations", "train_facts_model", "fact_predictions",
           "FactsComparison",
           "compare_methods", "N_SUBJ", "N_REL", "N_OBJ"]
