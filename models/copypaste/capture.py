"""Context-Parameter Copying Capturing (CopyPasteLLM Alg. 3), through the capture layer's public API.

For each sample the model answers with the context (``A_ctx``, greedy) and without it (``A_para``). Then, at
every step ``i`` of ``A_ctx``, the top-``K`` tokens of the next-token distribution ``P_i`` are scanned in order:
function words are skipped; a token in ``S_com`` (the common substrings of ``C`` and ``A_para``) stops the scan;
a token in ``C`` not yet captured is recorded as **contextual** (its probability, logit and the hidden state)
and stops the scan; otherwise a token in ``A_para`` not yet captured is recorded as **parametric** and stops it.

Choices where the digest is silent or uncertain (documented here and in docs/models/copypaste.md):

* token identity is the token's decoded text, stripped and lower-cased; ``C`` and ``A_para`` are the sets of
  such strings of their tokens; ``S_com`` is the union of the tokens of the Alg. 4 copy fragments of ``A_para``
  in ``C`` (:func:`copy_fragments` on these token strings);
* "captured" is per sample (a token string is captured at most once per answer);
* the hidden state is ``ln_final.hook_normalized`` at the position whose logits give ``P_i`` (the state the
  unembedding reads); the logit recorded is the captured token's raw logit there;
* function words: a small English stop-word list plus any token without a letter or digit;
* "logits power" at answer position ``i`` (radical placement uncertain in the PDF text): ``(sum_s l_s^2) * sqrt(n_i)``
  over the ``n_i`` samples with a captured token of that kind at position ``i``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from interp.progress import progress
from interp.results import Result

from .metrics import copy_fragments

FUNCTION_WORDS = frozenset("""a an the and or but if of to in on at by for with from as is are was were be been being
it its this that these those he she they we you i his her their our your my me him them us do does did not no so
than then there here what which who whom whose when where why how answer question context""".split())


@dataclass
class CaptureConfig:
    """``top_k``: tokens scanned per step; ``max_new_tokens``: answer length; ``batch_size``: prompts per
    generate call; ``function_words``: skipped token strings (lower-case); ``stop``: optional answer-end rule,
    ``stop(text) -> n`` keeps ``text[:n]`` of a decoded answer. Both answers (with and without context) are cut
    to the fewest tokens whose text covers the kept prefix; greedy decoding makes this the same as stopping
    the generation there."""

    top_k: int = 10
    max_new_tokens: int = 16
    batch_size: int = 16
    function_words: frozenset[str] = FUNCTION_WORDS
    stop: Callable[[str], int] | None = None

    def __post_init__(self):
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        self.function_words = frozenset(w.lower() for w in self.function_words)


@dataclass
class CaptureResult(Result):
    """Alg. 3 records. ``sample``, ``step``, ``token_id`` ``[n]`` (int), ``contextual`` ``[n]`` (bool: contextual
    or parametric), ``prob``, ``logit`` ``[n]``, ``hidden`` ``[n, d_model]``; ``tokens`` the captured strings;
    ``n_samples`` the number of samples scanned; ``answers_ctx`` / ``answers_para`` the generations."""

    kind = "copypaste_capture"
    sample: torch.Tensor
    step: torch.Tensor
    token_id: torch.Tensor
    contextual: torch.Tensor
    prob: torch.Tensor
    logit: torch.Tensor
    hidden: torch.Tensor
    tokens: list[str] = field(default_factory=list)
    n_samples: int = 0
    answers_ctx: list[str] = field(default_factory=list)
    answers_para: list[str] = field(default_factory=list)

    @property
    def contextual_share(self) -> float:
        """Contextual captures / all captures (``nan`` when nothing was captured)."""
        n = self.contextual.numel()
        return float(self.contextual.float().mean()) if n else float("nan")

    @property
    def contextual_per_sample(self) -> float:
        """Mean number of contextual captures per sample."""
        return float(self.contextual.sum()) / max(self.n_samples, 1)

    def logits_power(self) -> dict[str, np.ndarray]:
        """``{"contextual": [steps], "parametric": [steps]}``: ``(sum l^2) sqrt(n)`` per answer position."""
        steps = int(self.step.max()) + 1 if self.step.numel() else 0
        out = {}
        for name, sel in (("contextual", self.contextual), ("parametric", ~self.contextual)):
            sq = torch.zeros(steps).index_add_(0, self.step[sel], self.logit[sel].float() ** 2)
            n = torch.zeros(steps).index_add_(0, self.step[sel], torch.ones(int(sel.sum())))
            out[name] = (sq * n.sqrt()).numpy()
        return out

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame({"sample": self.sample.numpy(), "step": self.step.numpy(), "token": self.tokens,
                             "kind": np.where(self.contextual.numpy(), "contextual", "parametric"),
                             "prob": self.prob.numpy(), "logit": self.logit.numpy()})

    def figure(self):
        import plotly.graph_objects as go

        power = self.logits_power()
        fig = go.Figure([go.Bar(name=k, x=list(range(len(v))), y=v) for k, v in power.items()])
        fig.update_layout(title=f"Copying capture: contextual share {self.contextual_share:.2f}",
                          xaxis_title="answer position", yaxis_title="logits power (sum l^2) sqrt(n)", barmode="group")
        return fig


def _norm(tokenizer, ids: Sequence[int]) -> list[str]:
    return [tokenizer.decode([int(t)]).strip().lower() for t in ids]


def truncate_ids(tokenizer, ids: Sequence[int], stop: Callable[[str], int] | None) -> list[int]:
    """The fewest leading tokens of ``ids`` whose decoded text covers ``text[:stop(text)]`` (all of them when
    ``stop`` is None)."""
    ids = [int(t) for t in ids]
    if stop is None or not ids:
        return ids
    n = stop(tokenizer.decode(ids, skip_special_tokens=True))
    for k in range(len(ids) + 1):
        if len(tokenizer.decode(ids[:k], skip_special_tokens=True)) >= n:
            return ids[:k]
    return ids


def capture_copying(model, prompts_ctx: Sequence[str], prompts_para: Sequence[str], contexts: Sequence[str],
                    config: CaptureConfig | None = None) -> CaptureResult:
    """Alg. 3 over samples ``(prompt with context, prompt without context, context)``.

    ``model`` is an :class:`interp.Model` (any backend with a causal LM head). Uses only ``generate``,
    ``tokenize`` and ``run_with_cache``.
    """
    cfg = config or CaptureConfig()
    if not (len(prompts_ctx) == len(prompts_para) == len(contexts)) or not prompts_ctx:
        raise ValueError("prompts_ctx, prompts_para and contexts must be non-empty and of equal length, got "
                         f"{len(prompts_ctx)}, {len(prompts_para)}, {len(contexts)}")
    tok = model.tokenizer
    fw = cfg.function_words
    rows: dict[str, list] = {k: [] for k in ("sample", "step", "token_id", "contextual", "prob", "logit", "hidden", "tokens")}
    answers_ctx, answers_para = [], []
    n = len(prompts_ctx)
    for start in progress(range(0, n, cfg.batch_size), desc="copy capture", total=-(-n // cfg.batch_size)):
        sl = slice(start, start + cfg.batch_size)
        gen_ctx = model.generate(list(prompts_ctx[sl]), max_new_tokens=cfg.max_new_tokens, return_text=False)
        gen_para = model.generate(list(prompts_para[sl]), max_new_tokens=cfg.max_new_tokens, return_text=False)
        for j in range(gen_ctx.shape[0]):
            s = start + j
            a_ctx = truncate_ids(tok, [int(t) for t in gen_ctx[j] if t >= 0], cfg.stop)
            a_para = truncate_ids(tok, [int(t) for t in gen_para[j] if t >= 0], cfg.stop)
            answers_ctx.append(tok.decode(a_ctx, skip_special_tokens=True))
            answers_para.append(tok.decode(a_para, skip_special_tokens=True))
            if not a_ctx:
                continue
            c_str = _norm(tok, model.tokenize([contexts[s]])["input_ids"][0].tolist())
            p_str = _norm(tok, a_para)
            c_set, p_set = set(c_str), set(p_str)
            s_com = {t for f in copy_fragments(p_str, c_str) for t in f} if p_str else set()
            prompt_ids = model.tokenize([prompts_ctx[s]])["input_ids"][0]
            ids = torch.cat([prompt_ids, torch.tensor(a_ctx, dtype=prompt_ids.dtype)])
            logits, cache = model.run_with_cache(ids[None], names=["ln_final.hook_normalized"])
            first = prompt_ids.numel() - 1                           # logits here give P_0
            lg = logits[0, first:first + len(a_ctx)].float()         # [steps, vocab]
            hid = cache["ln_final.hook_normalized"][0, first:first + len(a_ctx)]
            probs = lg.softmax(-1)
            top = probs.topk(min(cfg.top_k, probs.shape[-1]), dim=-1).indices  # [steps, K]
            captured: set[str] = set()
            for i in range(len(a_ctx)):
                for t, t_str in zip(top[i].tolist(), _norm(tok, top[i].tolist())):
                    if t_str in fw or not any(ch.isalnum() for ch in t_str):
                        continue
                    if t_str in s_com:
                        break
                    kind = True if (t_str in c_set and t_str not in captured) else (
                        False if (t_str in p_set and t_str not in captured) else None)
                    if kind is None:
                        continue
                    captured.add(t_str)
                    for k, v in (("sample", s), ("step", i), ("token_id", t), ("contextual", kind),
                                 ("prob", float(probs[i, t])), ("logit", float(lg[i, t])), ("hidden", hid[i]),
                                 ("tokens", t_str)):
                        rows[k].append(v)
                    break
    d = model.cfg.d_model
    return CaptureResult(
        sample=torch.tensor(rows["sample"], dtype=torch.long), step=torch.tensor(rows["step"], dtype=torch.long),
        token_id=torch.tensor(rows["token_id"], dtype=torch.long),
        contextual=torch.tensor(rows["contextual"], dtype=torch.bool),
        prob=torch.tensor(rows["prob"]), logit=torch.tensor(rows["logit"]),
        hidden=torch.stack(rows["hidden"]).float() if rows["hidden"] else torch.zeros(0, d),
        tokens=rows["tokens"], n_samples=n, answers_ctx=answers_ctx, answers_para=answers_para)
