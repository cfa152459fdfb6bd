"""ROME on an MLP, TCPE on a transcoder, and constrained fine-tuning: rank-one / masked knowledge edits.

All three edit one *site*: a linear map ``out = k @ W + b`` from a key space to the residual stream.

========  ==========================================  ===============================  =====================
site      key ``k`` (hook)                            output (where ``δ`` is added)    ``W`` (TL shape)
========  ==========================================  ===============================  =====================
MLP       ``blocks.{l}.mlp.hook_post`` [.., d_mlp]     ``blocks.{l}.hook_mlp_out``      ``W_out[l]`` [d_mlp, d]
TC        transcoder features ``z`` [.., d_sae]        the spliced transcoder output    ``W_dec`` [d_sae, d]
========  ==========================================  ===============================  =====================

ROME (Meng et al. 2022) and TCPE (digest §5), step by step:

1. **Context templates** (:func:`context_templates`): ``"{}"`` plus prefixes sampled from the model, each as
   ``"<prefix>. {}"``: ROME's 20 (10 of 4 and 10 of 9 tokens after ``<|endoftext|>``, top-5 sampling, seeded) by
   default; TCPE's one of 9 tokens with :meth:`EditConfig.tcpe`; ours before (``template_scheme="seed_words"``):
   ``n_templates`` samples after ROME's seed words ``The, Therefore, Because, I, You``.
2. **Key** ``k*``: the mean over templates of the key at the subject's last token of
   ``template.format(prompt.format(subject))`` (TCPE's ``fact_token="subject_last"``; ``EditConfig(fact_token=
   "last")`` uses the prompt's last token instead, ROME's other option, also for where ``δ`` is added).
3. **Left vector** ``u = (C + εI)⁻¹ k*`` with ``C = E[k kᵀ]`` over every real token of the first
   ``n_samples`` real texts (:func:`second_moment`, ROME's text count; cached per (model, key hook, transcoder,
   text) in memory and optionally on disk; without texts, :func:`default_second_moment`'s built-in corpus, stored).
   ``ε = mom2_eps`` defaults to 0 (TCPE's code: 0 or 1e-8); a singular ``C`` (dead features; the low-rank key
   space of a toy's layer-0 transcoder) is solved by least squares (:func:`left_vector`: QR, or the SVD
   minimum-norm solution where QR returns zero); when
   ``k*`` has no component in C's range :func:`rank_one` raises a ``ValueError`` (set ``mom2_eps > 0``, the
   documented regularisation ``C + εI``; ``mom2_eps_rel`` adds ``mom2_eps_rel · mean(diag C)`` to ε, a ridge on
   the scale of C). ``Edit.log`` records ``cos_uk = uᵀk*/‖k*‖`` (small: the update
   lives in directions text rarely visits, and ``r = (v* − W k*)/(uᵀk*)`` is large) and ``n_blind``, the key
   features never active in C's text.
4. **Right vector**: ROME's ``compute_v``. ``δ`` is added to the site's output at the subject's last token
   of every rewriting prompt ``template.format(prompt) + target[:-1]`` and of the KL prompts; minimise
   ``NLL(target) + kl_factor · KL(p_δ ‖ p₀)`` (on ``kl_prompts``, "{} is a", at the subject's last token)
   ``+ v_weight_decay · ‖δ‖ / ‖v₀‖²`` with Adam, stopping when the total loss is < 0.05 (the last iteration
   takes no step), clamping ``‖δ‖ ≤ clamp_norm_factor · ‖v₀‖`` after each step. ``v₀`` is the site output at
   the subject's last token of the plain prompt; ``v* = v₀ + δ``. Defaults: ROME's GPT-2 hyper-parameters
   (``hparams/ROME/gpt2-xl.json``: 20 iterations, ``v_lr`` 0.5, decay 0.5, clamp 4, ``kl_factor`` 0.0625);
   :meth:`EditConfig.tcpe` gives TCPE's; ours before are named options (:class:`EditConfig`).
5. **Rank-one update** ``ΔW = u rᵀ`` with ``r = (v* − (k W + b)) / (uᵀ k)``, so that ``k W' + b = v*``: ROME's
   code takes ``k`` = the plain prompt's key (the default on an MLP), TCPE's code (and the digest's formula)
   ``k = k*`` (the default on a transcoder); ``EditConfig.right_vector_key`` chooses.
6. **TCPE mask**: ``S = {a : k*_a > 0 and k*_a ≥ τ}`` (the code keeps non-zero entries ``≥ lim``; ``τ < 0``
   keeps every feature: unmasked ROME on the transcoder). Rows of ``ΔW`` outside ``S`` are zeroed
   (``ablate=True`` zeroes the rows inside ``S`` instead, the paper's ablation).

Weights: transcoder edits write the transcoder's own ``W_dec``. MLP edits write the model's ``W_out[l]``
through the capture layer's :meth:`interp.Model.add_to_weight` (TransformerLens shape ``[d_mlp, d_model]``,
HF backends). Nothing else of the model is touched.
"""
from __future__ import annotations

import hashlib
from dataclasses import InitVar, dataclass, field
from typing import Sequence

import torch

from interp.progress import progress
from interp.results import Result

from .transcoders import Transcoder, _model_identity, default_transcoder, splice as tc_splice

SEED_WORDS = ("The", "Therefore", "Because", "I", "You")


# ====================================================================== request and config
@dataclass(frozen=True)
class EditRequest:
    """``prompt`` with one ``{}`` slot for ``subject``; ``target`` is the new continuation (with its leading
    space, e.g. ``EditRequest("The capital of {} is", "Italy", " Rome")``)."""

    prompt: str
    subject: str
    target: str

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str) or self.prompt.count("{}") != 1:
            raise ValueError(f"prompt must contain exactly one '{{}}' slot for the subject, got {self.prompt!r}")
        if not isinstance(self.subject, str) or not self.subject:
            raise ValueError("subject must be a non-empty string")
        if not isinstance(self.target, str) or not self.target:
            raise ValueError("target must be a non-empty string")

    @property
    def text(self) -> str:
        return self.prompt.format(self.subject)


@dataclass
class EditConfig:
    """Hyper-parameters of ROME / TCPE. The defaults are ROME's official ones (``hparams/ROME/gpt2-xl.json`` and
    ``rome/compute_v.py`` of kmeng01/rome); :meth:`tcpe` gives TCPE's (``run_tcpe.py`` and
    ``sweep/tcpe_precompute.sh`` of minxue29031/TCPE). Ours, kept as named options:

    * ``stop_rule``: ``"rome"`` (official ROME: stop when the TOTAL loss is < ``nll_stop`` = 0.05; the last of the
      ``v_num_grad_steps`` iterations evaluates the loss but takes no step), ``"tcpe"`` (official TCPE: no
      threshold; with ≥ 500 steps, stop after 3 consecutive steps whose NLL fell by < 1e-3), ``"nll"`` (ours
      before 2026-12-02: stop when the NLL alone is < ``nll_stop``; every iteration takes a step), ``"none"``.
    * ``weight_decay_form``: ``"rome"`` (``v_weight_decay · ‖δ‖ / ‖v₀‖²``, ROME's code) or ``"squared"``
      (``v_weight_decay · ‖δ‖² / ‖v₀‖²``: TCPE's code, and ours before).
    * ``kl_direction``: ``"p_delta||p0"`` (``KL(p_δ ‖ p₀)``, ROME's and TCPE's ``kl_div(p0, p_δ)``) or
      ``"p0||p_delta"`` (ours before).
    * ``kl_mode``: ``"rome"`` (ROME's code: ``δ`` is added at the fact token of the KL prompts too, so
      ``kl_factor · KL`` keeps the subject's other predictions) or ``"tcpe_code"`` (TCPE's official code: the KL
      prompt never receives ``δ``, so its KL term is identically zero and ``kl_factor`` has no effect; v* then
      matches the official one to 6.9e-7, against 0.86 % apart with ``"rome"``, issue #42). :meth:`tcpe` keeps
      ``"rome"``: pass ``kl_mode="tcpe_code"`` for the official code's behaviour.
    * ``right_vector_key``: where ``r = (v* − (k W + b)) / (uᵀk)`` is solved: ``"prompt"`` (ROME: the key of the
      plain prompt at the fact token), ``"k_star"`` (TCPE's code and the TCPE digest's formula: the template
      mean ``k*``), ``None`` = the site's official one (``"prompt"`` on an MLP, ``"k_star"`` on a transcoder).
    * context templates (``template_scheme``): ``"rome"`` samples, from the tokenizer's BOS token (ROME:
      ``<|endoftext|>``), ``n`` continuations of ``length − 1`` new tokens for each ``(length, n)`` of
      ``context_template_length_params`` (ROME: ``((5, 10), (10, 10))``, 20 templates; TCPE: ``((10, 1),)``) with
      top-``template_top_k`` sampling, seeded by ``template_seed``; ``"seed_words"`` (ours before) samples
      ``n_templates`` (default 5) continuations of ``template_length`` (default 10) tokens after the seed words
      ``The, Therefore, Because, I, You`` (setting either with the ROME scheme is an error, not ignored). Both add
      ``"{}"`` first.
    * ``mom2_n_samples``: the number of TEXTS (ROME's ``mom2_n_samples`` = 100,000 Wikipedia texts of up to
      ``n_positions`` = 1,024 tokens; TCPE's 500,000) the second moment of :func:`rome`/:func:`tcpe` is estimated
      from when neither ``C`` nor ``texts`` is given (:func:`default_second_moment`).
    """

    n_templates: int | None = None
    template_length: int | None = None
    template_seed: int = 0
    v_num_grad_steps: int = 20
    v_lr: float = 0.5
    v_weight_decay: float = 0.5
    kl_factor: float = 0.0625
    clamp_norm_factor: float = 4.0
    kl_prompts: tuple[str, ...] = ("{} is a",)
    mom2_eps: float = 0.0
    mom2_eps_rel: float = 0.0
    nll_stop: float = 5e-2
    fact_token: str = "subject_last"
    stop_rule: str = "rome"
    weight_decay_form: str = "rome"
    kl_direction: str = "p_delta||p0"
    kl_mode: str = "rome"
    right_vector_key: str | None = None
    template_scheme: str = "rome"
    context_template_length_params: tuple[tuple[int, int], ...] = ((5, 10), (10, 10))
    template_top_k: int = 5
    mom2_n_samples: int = 100_000

    @classmethod
    def tcpe(cls, **overrides) -> "EditConfig":
        """TCPE's official hyper-parameters (``run_tcpe.py``, ``sweep/tcpe_precompute.sh``): 600 steps, no 0.05
        early stop (``stop_rule="tcpe"``), ``‖δ‖²/‖v₀‖²`` decay 1e-3, ``r`` at ``k*``, one context template of 10
        tokens, ``C`` from 500,000 samples with ``ε = 1e-8``. The sweep tries ``v_lr`` in {0.01, 0.05, 0.005} and
        ``clamp_norm_factor`` in {18, 13, 8, 4}; the preset takes the first of each (0.01, 18).

        One behaviour is not the official code's: the KL term. TCPE's code never adds ``δ`` at the KL prompt, so
        its KL term is identically zero; this preset keeps ROME's working KL term (``kl_mode="rome"``, v* 0.86 %
        from the official with these defaults). ``EditConfig.tcpe(kl_mode="tcpe_code")`` is the official code's
        behaviour (v* within 6.9e-7 of it)."""
        base = dict(v_num_grad_steps=600, v_lr=0.01, clamp_norm_factor=18.0, v_weight_decay=1e-3, kl_factor=0.0625,
                    stop_rule="tcpe", weight_decay_form="squared", kl_direction="p_delta||p0",
                    right_vector_key="k_star", context_template_length_params=((10, 1),), mom2_eps=1e-8,
                    mom2_n_samples=500_000)
        return cls(**{**base, **overrides})

    def __post_init__(self) -> None:
        if self.template_scheme not in ("rome", "seed_words"):
            raise ValueError(f"template_scheme must be 'rome' or 'seed_words', got {self.template_scheme!r}")
        if self.template_scheme == "rome" and (self.n_templates is not None or self.template_length is not None):
            raise ValueError("n_templates / template_length belong to template_scheme='seed_words' (ours); ROME's "
                             "scheme (the default) samples context_template_length_params = ((length, count), ...) "
                             "from the BOS token, e.g. () for the plain prompt only")
        if self.template_scheme == "seed_words":
            self.n_templates = 5 if self.n_templates is None else self.n_templates
            self.template_length = 10 if self.template_length is None else self.template_length
        for name in ("n_templates", "template_length", "v_num_grad_steps", "template_top_k", "mom2_n_samples"):
            v = getattr(self, name)
            if v is None and name in ("n_templates", "template_length"):
                continue
            lo = 0 if name == "n_templates" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
        for name in ("v_lr", "clamp_norm_factor"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"{name} must be a number > 0, got {v!r}")
        for name in ("v_weight_decay", "kl_factor", "mom2_eps", "mom2_eps_rel", "nll_stop"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v >= 0):
                raise ValueError(f"{name} must be a number >= 0, got {v!r}")
        if self.fact_token not in ("subject_last", "last"):
            raise ValueError(f"fact_token must be 'subject_last' or 'last', got {self.fact_token!r}")
        if any(not isinstance(p, str) or p.count("{}") != 1 for p in self.kl_prompts):
            raise ValueError(f"kl_prompts must be strings with one '{{}}' slot, got {self.kl_prompts!r}")
        for name, ok in (("stop_rule", ("rome", "tcpe", "nll", "none")), ("weight_decay_form", ("rome", "squared")),
                         ("kl_direction", ("p_delta||p0", "p0||p_delta")), ("kl_mode", ("rome", "tcpe_code")),
                         ("right_vector_key", (None, "prompt", "k_star")),
                         ("template_scheme", ("rome", "seed_words"))):
            if getattr(self, name) not in ok:
                raise ValueError(f"{name} must be one of {ok}, got {getattr(self, name)!r}")
        params = tuple(tuple(p) for p in self.context_template_length_params)
        if any(len(p) != 2 or any(isinstance(x, bool) or not isinstance(x, int) for x in p) or p[0] < 2 or p[1] < 1
               for p in params):
            raise ValueError("context_template_length_params must be (length >= 2, count >= 1) integer pairs, got "
                             f"{self.context_template_length_params!r}")
        self.context_template_length_params = params


# ====================================================================== sites
class _Site:
    """Where an edit acts: the key hook, how to add ``δ`` to the output, and ``W``/``b``."""

    kind = ""

    def __init__(self, model, layer: int) -> None:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < model.cfg.n_layers:
            raise ValueError(f"layer must be an integer in 0..{model.cfg.n_layers - 1}, got {layer!r}")
        self.model, self.layer = model, layer

    def open(self):  # context for every forward of the edit
        import contextlib
        return contextlib.nullcontext()


class MLPSite(_Site):
    kind = "mlp"

    def __init__(self, model, layer: int) -> None:
        super().__init__(model, layer)
        self.key = f"blocks.{layer}.mlp.hook_post"
        self.out = f"blocks.{layer}.hook_mlp_out"

    def W(self) -> torch.Tensor:
        return self.model.weight("W_out")[self.layer].float()

    def raw_W(self) -> torch.Tensor:
        """``W`` in the weight's own dtype (what an edit records as its starting point)."""
        return self.model.weight("W_out")[self.layer]

    def b(self) -> torch.Tensor:
        return self.model.weight("b_out")[self.layer].float()


class TranscoderSite(_Site):
    kind = "transcoder"

    def __init__(self, model, layer: int, transcoder: Transcoder) -> None:
        super().__init__(model, layer)
        self.tc = transcoder
        self.key = f"blocks.{layer}.hook_mlp_out.hook_sae_acts_post"
        self.out = f"blocks.{layer}.hook_mlp_out.hook_sae_output"

    def open(self):
        return tc_splice(self.model, self.layer, self.tc)

    def W(self) -> torch.Tensor:
        return self.tc.W_dec.detach().float()

    def raw_W(self) -> torch.Tensor:
        """``W`` in the weight's own dtype (what an edit records as its starting point)."""
        return self.tc.W_dec.detach().clone()

    def b(self) -> torch.Tensor:
        return self.tc.b_dec.detach().float()


# ====================================================================== tokens and positions
def _ids(model, text: str, special: bool = True) -> list[int]:
    return model.tokenize([text], add_special_tokens=special)["input_ids"][0].tolist()


def _subject_last(model, template: str, req: EditRequest, fact_token: str = "subject_last") -> int:
    """Index of the subject's last token in ``template.format(req.text)`` (``fact_token="last"``: of the
    prompt's last token, ROME's other lookup option)."""
    if fact_token == "last":
        return len(_ids(model, template.format(req.text))) - 1
    return len(_ids(model, template.format(req.prompt.split("{}")[0] + req.subject))) - 1


def _has_unk(model, text: str) -> bool:
    unk = getattr(model.tokenizer, "unk_token_id", None)
    return unk is not None and unk in _ids(model, text, special=False)


_TEMPLATES: dict[tuple, list[str]] = {}


def _template_key(model, cfg: EditConfig) -> tuple:
    if cfg.template_scheme == "rome":
        return (id(model), "rome", cfg.context_template_length_params, cfg.template_top_k, cfg.template_seed)
    return (id(model), "seed_words", cfg.n_templates, cfg.template_length, cfg.template_seed)


def context_templates(model, config: EditConfig | None = None) -> list[str]:
    """``["{}"] + ["<sampled prefix>. {}", ...]``: context templates sampled from ``model`` (seeded, so the same
    model and config give the same templates; cached in memory per model and config, as ROME caches them once
    per process, and on disk with the second moments by :func:`default_second_moment`).

    ``template_scheme="rome"`` (official; ROME's ``get_context_templates`` / TCPE's): for each ``(length, n)`` of
    ``config.context_template_length_params``, ``n`` sequences started at the tokenizer's BOS token (GPT-2:
    ``<|endoftext|>``; the EOS token where there is no BOS) and continued by ``length − 1`` tokens sampled from
    the top ``template_top_k`` (ROME's ``generate_fast``: ``max_out_len`` counts the start token); the text is the
    decoded continuation (special tokens dropped, NFKD-normalised, ``"\\n\\n"`` → ``" "``), braces doubled
    (TCPE's escape) and ``". {}"`` appended (``" . {}"`` where ``"<prefix>."`` would contain the tokenizer's unknown
    token, as below; never for BPE tokenizers).

    ``template_scheme="seed_words"`` (ours before 2026-12-02): ``n_templates`` prefixes, the *decoded token
    sequence* seed word + ``template_length`` sampled tokens (a word-level tokenizer decodes a continuation
    without its leading space, so the strings are not glued), with ``" . {}"`` instead of ``". {}"`` where
    ``"<prefix>."`` would contain the tokenizer's unknown token (word-level vocabularies).
    """
    import unicodedata
    cfg = config or EditConfig()
    key = _template_key(model, cfg)
    if key in _TEMPLATES:
        return list(_TEMPLATES[key])
    out = ["{}"]
    eos = model.tokenizer.eos_token_id
    if cfg.template_scheme == "rome":
        start = model.tokenizer.bos_token_id if model.tokenizer.bos_token_id is not None else eos
        if start is None:
            raise ValueError("template_scheme='rome' starts each template at the tokenizer's BOS (or EOS) token, and "
                             "this tokenizer has neither; use EditConfig(template_scheme='seed_words')")
        special = set(getattr(model.tokenizer, "all_special_ids", []) or [])
        for j, (length, n) in enumerate(cfg.context_template_length_params):
            gen = model.generate(torch.full((n, 1), start, dtype=torch.long), max_new_tokens=length - 1,
                                 do_sample=True, top_k=cfg.template_top_k, seed=cfg.template_seed + j,
                                 stop_at_eos=False, return_text=False)
            for g in gen.tolist():
                ids = [t for t in g if t >= 0 and t not in special]
                txt = unicodedata.normalize("NFKD", model.tokenizer.decode(ids, skip_special_tokens=True))
                txt = txt.replace("\n\n", " ").replace("{", "{{").replace("}", "}}")
                unk_dot = _has_unk(model, txt + ".") and not _has_unk(model, txt + " .")
                out.append(txt + (" . {}" if unk_dot else ". {}"))
    elif cfg.n_templates:
        seeds = [SEED_WORDS[i % len(SEED_WORDS)] for i in range(cfg.n_templates)]
        gen = model.generate(seeds, max_new_tokens=cfg.template_length, do_sample=True, seed=cfg.template_seed,
                             return_text=False)
        for w, g in zip(seeds, gen.tolist()):
            ids = _ids(model, w, special=False) + [t for t in g if t >= 0 and t != eos]
            txt = model.tokenizer.decode(ids, skip_special_tokens=True).replace("{", " ").replace("}", " ").strip()
            out.append(txt + (" . {}" if _has_unk(model, txt + ".") and not _has_unk(model, txt + " .") else ". {}"))
    _TEMPLATES[key] = list(out)
    return out


# ====================================================================== key, second moment, v
@torch.no_grad()
def compute_key(site: _Site, req: EditRequest, templates: Sequence[str], fact_token: str = "subject_last") -> torch.Tensor:
    """``k* [d_key]``: mean over ``templates`` of the key at the subject's last token (or the last token)."""
    model = site.model
    seqs = [_ids(model, t.format(req.text)) for t in templates]
    idx = torch.tensor([_subject_last(model, t, req, fact_token) for t in templates])
    with site.open():
        _, cache = model.run_with_cache(model.pad_token_ids(seqs), names=[site.key])
    keys = cache[site.key].float()[torch.arange(len(seqs)), idx.to(cache[site.key].device)]
    return keys.mean(0).cpu()


_MOM2: dict[tuple, torch.Tensor] = {}


def _site_digest(site: _Site) -> str:
    """A digest of what the key depends on besides the text: the hook, the model's weights feeding the key
    (the layer's MLP input weights / the transcoder's encoder) and sizes."""
    h = hashlib.sha1(f"{site.key}|{site.layer}|{site.model.cfg.d_model}|{site.model.cfg.n_layers}".encode())
    ws = [site.tc.W_enc, site.tc.b_enc] if isinstance(site, TranscoderSite) else [site.model.weight("W_in")[site.layer]]
    for w in ws:
        h.update(w.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _context_length(model) -> int | None:
    """The model's context length (ROME truncates the second moment's texts to ``n_positions``), or ``None``."""
    hc = getattr(getattr(model, "hf_model", None), "config", None)
    for name in ("n_positions", "max_position_embeddings", "n_ctx"):
        v = getattr(hc, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def second_moment(site: _Site, texts: Sequence[str], n_tokens: int | None = None, batch_size: int = 16,
                  max_length: int | None = None, cache_file: str | None = None,
                  n_samples: int | None = 100_000) -> torch.Tensor:
    """``C = E[k kᵀ] [d_key, d_key]`` over every real token of the first ``n_samples`` of ``texts``, each
    truncated to ``max_length`` tokens; cached in memory per (model, key hook, transcoder, texts, counts).

    Counting (official, ROME's ``layer_stats``): ``n_samples`` TEXTS (ROME's ``mom2_n_samples`` = 100,000
    Wikipedia texts; TCPE's 500,000 samples of its code data set), each truncated to the model's context length
    (``max_length=None``: ``n_positions``, 1,024 for GPT-2); ROME draws its texts at random with a fixed seed,
    we take the first ``n_samples``. ``n_tokens`` (ours before 2026-12-02, then 20,000 with ``max_length=128``)
    additionally stops after that many tokens. Cost: one forward pass (up to the site's layer) over every
    counted token.

    ``cache_file``: a ``.safetensors`` file (written atomically) holding ``C`` with, in its metadata, digests of the
    texts and of the key's weights (:func:`_site_digest`) and the counts; a matching file is read instead of
    recomputing, a stale one is recomputed and replaced. (:func:`second_moments` computes several sites from one
    forward pass.)
    """
    return second_moments([site], texts, n_tokens, batch_size, max_length, [cache_file], n_samples)[0]


@torch.no_grad()
def second_moments(sites: Sequence[_Site], texts: Sequence[str], n_tokens: int | None = None, batch_size: int = 16,
                   max_length: int | None = None, cache_files: Sequence[str | None] | None = None,
                   n_samples: int | None = 100_000) -> list[torch.Tensor]:
    """:func:`second_moment` of several sites of one model from one forward pass per batch (same tokens, so each
    ``C`` is the single-site one up to float64 round-off; same memory and file caches). At most one site may be
    a :class:`TranscoderSite` (its splice is open for the pass); every :class:`MLPSite` must sit at or before
    its layer, whose key (``mlp.hook_post``, inside the MLP) the splice of ``hook_mlp_out`` does not change.

    The float64 accumulation ``Σ k kᵀ`` is restricted per batch to the key features active in it (exact: the
    others add zeros); for a sparse transcoder this is most of the cost saved.
    """
    import contextlib
    if not texts:
        raise ValueError("texts is empty: C is estimated from real text (rome()/tcpe() without C or texts use "
                         "default_second_moment's built-in corpus)")
    for name, v in (("n_tokens", n_tokens), ("n_samples", n_samples), ("max_length", max_length)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be a positive integer or None, got {v!r}")
    texts = list(texts)[:n_samples] if n_samples is not None else list(texts)
    if max_length is None:
        max_length = _context_length(sites[0].model) if sites else None
    cap = n_tokens if n_tokens is not None else float("inf")
    sites = list(sites)
    files = list(cache_files) if cache_files is not None else [None] * len(sites)
    if len(files) != len(sites) or not sites or len({id(s.model) for s in sites}) != 1:
        raise ValueError("second_moments needs one or more sites of one model and one cache file (or None) each")
    tcs = [s for s in sites if isinstance(s, TranscoderSite)]
    if len(tcs) > 1 or (tcs and any(not isinstance(s, TranscoderSite) and s.layer > tcs[0].layer for s in sites)):
        raise ValueError("at most one TranscoderSite, with every other site at or before its layer")
    h = hashlib.sha1("\x00".join(texts).encode()).hexdigest()
    out: list = [None] * len(sites)
    metas: list = [None] * len(sites)
    for i, (site, cf) in enumerate(zip(sites, files)):
        key = (id(site.model), site.key, id(getattr(site, "tc", None)), h, n_tokens, max_length, n_samples)
        if key in _MOM2:
            out[i] = _MOM2[key]
            continue
        if cf is not None:
            from pathlib import Path
            from interp.io import load_tensors
            metas[i] = {"texts": h, "site": _site_digest(site), "n_tokens": n_tokens, "max_length": max_length,
                        "n_samples": n_samples}
            if Path(cf).is_file():
                t, m = load_tensors(cf, what="second moment", tensors=("C",))
                if all(m.get(k) == v for k, v in metas[i].items()):
                    out[i] = _MOM2[key] = t["C"].float()
    todo = [i for i in range(len(sites)) if out[i] is None]
    if not todo:
        return out
    model, n = sites[0].model, 0
    acc = {i: None for i in todo}
    names = list(dict.fromkeys(sites[i].key for i in todo))
    stop = max(sites[i].layer for i in todo) + 1
    bar = progress(total=len(texts), desc=f"second moment {', '.join(names)}")
    with contextlib.ExitStack() as stack:
        for i in todo:
            if isinstance(sites[i], TranscoderSite):
                stack.enter_context(sites[i].open())
        for b in range(0, len(texts), batch_size):
            batch = model.tokenize(list(texts[b:b + batch_size]), max_length=max_length)
            _, cache = model.run_with_cache(batch, names=names, stop_at_layer=stop)
            m = None
            for i in todo:
                c = cache[sites[i].key]
                k = c[batch["attention_mask"].bool().to(c.device)].double().cpu()
                k = k[: cap - n] if cap != float("inf") else k
                if acc[i] is None:
                    acc[i] = torch.zeros(k.shape[1], k.shape[1], dtype=torch.float64)
                cols = (k != 0).any(0).nonzero().flatten()
                if len(cols) < 0.9 * k.shape[1]:
                    kk = k[:, cols]
                    acc[i][cols[:, None], cols[None, :]] += kk.T @ kk
                else:
                    acc[i] += k.T @ k
                m = len(k)
            n += m
            bar.update(len(texts[b:b + batch_size]))
            if n >= cap:
                break
    bar.close()
    for i in todo:
        site = sites[i]
        C = (acc[i] / n).float()
        out[i] = _MOM2[(id(site.model), site.key, id(getattr(site, "tc", None)), h, n_tokens, max_length,
                        n_samples)] = C
        if files[i] is not None:
            from interp.io import save_tensors
            save_tensors(files[i], {"C": C}, {**metas[i], "n_seen": n})
    return out


def _rewrite_batch(model, req: EditRequest, templates: Sequence[str], kl_prompts: Sequence[str],
                   fact_token: str = "subject_last"):
    """Token ids of the rewriting prompts (``template(prompt) + target[:-1]``) and KL prompts, the subject's
    last index in each, and the target positions/ids of the rewriting prompts."""
    tgt = _ids(model, req.target, special=False)
    if not tgt:
        raise ValueError(f"target {req.target!r} tokenizes to nothing")
    seqs, idx, tpos = [], [], []
    for t in templates:
        p = _ids(model, t.format(req.text))
        seqs.append(p + tgt[:-1])
        idx.append(_subject_last(model, t, req, fact_token))
        tpos.append(list(range(len(p) - 1, len(p) - 1 + len(tgt))))
    for kp in kl_prompts:
        kreq = EditRequest(kp, req.subject, req.target)
        seqs.append(_ids(model, kreq.text))
        idx.append(_subject_last(model, "{}", kreq, fact_token))
    return model.pad_token_ids(seqs), torch.tensor(idx), torch.tensor(tpos), torch.tensor(tgt)


def kl_term(logits: torch.Tensor, logp0: torch.Tensor, direction: str = "p_delta||p0") -> torch.Tensor:
    """The KL term of ``compute_v`` (batch mean over KL prompts): ``logits [n, vocab]`` of the edited pass and
    ``logp0 [n, vocab]`` the unedited log-probabilities. ``"p_delta||p0"`` (official: ROME's and TCPE's
    ``kl_div(logp0, logp_δ, log_target=True)``) is ``Σ p_δ (log p_δ − log p₀)``; ``"p0||p_delta"`` (ours before)
    is ``Σ p₀ (log p₀ − log p_δ)``."""
    lp = logits.float().log_softmax(-1)
    if direction == "p_delta||p0":
        return torch.nn.functional.kl_div(logp0, lp, log_target=True, reduction="batchmean")
    return torch.nn.functional.kl_div(lp, logp0, log_target=True, reduction="batchmean")


def weight_decay_term(delta: torch.Tensor, v0: torch.Tensor, coef: float, form: str = "rome") -> torch.Tensor:
    """``coef · ‖δ‖ / ‖v₀‖²`` (``form="rome"``, ROME's code) or ``coef · ‖δ‖² / ‖v₀‖²`` (``"squared"``: TCPE's
    code, ours before). ``delta, v0 [d]``."""
    v0n = v0.norm().clamp_min(1e-8)
    return coef * (delta.norm() if form == "rome" else delta.norm() ** 2) / v0n ** 2


def compute_v(site: _Site, req: EditRequest, templates: Sequence[str], config: EditConfig | None = None
              ) -> tuple[torch.Tensor, dict]:
    """ROME's ``compute_v``: ``v* [d_model]`` and a log (``nll``/``loss``/``kl`` per iteration, ``delta_norm``, ``v0``).

    ``δ`` is added to the site's output at the fact token of every rewriting prompt and KL prompt; each
    iteration computes ``loss = NLL + kl_factor · KL + weight decay`` (:func:`kl_term`, :func:`weight_decay_term`),
    checks ``config.stop_rule`` (:class:`EditConfig`), takes one Adam step and clamps ``‖δ‖ ≤ clamp_norm_factor ·
    ‖v₀‖``. The KL prompt receives ``δ`` as in ROME's code (``kl_mode="rome"``); with ``kl_mode="tcpe_code"`` it
    does not, as in TCPE's code, so the KL term is identically zero.
    """
    cfg = config or EditConfig()
    model = site.model
    batch, idx, tpos, tgt = _rewrite_batch(model, req, templates, cfg.kl_prompts, cfg.fact_token)
    n_rw = len(templates)
    rows = torch.arange(len(idx))
    d = model.cfg.d_model
    delta = torch.zeros(d, requires_grad=True)
    state: dict = {}

    # the rows that receive δ: every prompt (ROME), or the rewriting prompts only (TCPE's code: KL term = 0)
    edited = rows if cfg.kl_mode == "rome" else rows[:n_rw]

    def add_delta(t: torch.Tensor, ctx) -> torch.Tensor:
        state["v0"] = t[0, idx[0]].detach().float().clone()
        onehot = torch.zeros(t.shape[:2], dtype=t.dtype, device=t.device)
        onehot[edited.to(t.device), idx[edited].to(t.device)] = 1
        return t + onehot[..., None] * delta.to(t.dtype).to(t.device)

    with site.open():
        with torch.no_grad():
            base = model(batch).float()
        p0 = base[rows[n_rw:], idx[n_rw:]].log_softmax(-1)
        opt = torch.optim.Adam([delta], lr=cfg.v_lr)
        log: dict = {"nll": [], "loss": [], "kl": []}
        prev_nll, stagnant = float("inf"), 0
        with model.intervene({site.out: add_delta}):
            for it in range(cfg.v_num_grad_steps):
                logits = model.forward_with_grad(batch).float()
                lp = logits[:n_rw].log_softmax(-1)
                tok_lp = lp[torch.arange(n_rw)[:, None], tpos, :].gather(-1, tgt.expand(n_rw, -1)[..., None])[..., 0]
                nll = -tok_lp.mean(1).mean()
                kl = kl_term(logits[rows[n_rw:], idx[n_rw:]], p0, cfg.kl_direction) if len(idx) > n_rw else 0.0
                v0n = state["v0"].norm().clamp_min(1e-8)
                wd = weight_decay_term(delta, state["v0"], cfg.v_weight_decay, cfg.weight_decay_form)
                loss = nll + cfg.kl_factor * kl + wd
                log["nll"].append(float(nll.detach()))
                log["loss"].append(float(loss.detach()))
                log["kl"].append(float(kl.detach()) if isinstance(kl, torch.Tensor) else float(kl))
                if cfg.stop_rule == "rome" and (float(loss.detach()) < cfg.nll_stop or it == cfg.v_num_grad_steps - 1):
                    break
                if cfg.stop_rule == "nll" and float(nll.detach()) < cfg.nll_stop:
                    break
                if cfg.stop_rule == "tcpe" and cfg.v_num_grad_steps >= 500:
                    stagnant = stagnant + 1 if prev_nll - float(nll.detach()) < 1e-3 else 0
                    prev_nll = float(nll.detach())
                    if stagnant >= 3:
                        break
                (g,) = torch.autograd.grad(loss, [delta])
                delta.grad = g
                opt.step()
                with torch.no_grad():
                    mx = cfg.clamp_norm_factor * v0n
                    if delta.norm() > mx:
                        delta.mul_(mx / delta.norm())
    v0 = state["v0"].cpu()
    log.update(delta_norm=float(delta.detach().norm()), v0_norm=float(v0.norm()))
    return (v0 + delta.detach()).cpu(), log


# ====================================================================== the edit
def _fingerprint(rows: torch.Tensor, values: torch.Tensor) -> str:
    """SHA-256 of which rows, their shape, dtype and exact bytes: equal exactly when the rows are bit for bit
    the same (a stable identity of a weight state, cheap enough to check on every apply and revert)."""
    h = hashlib.sha256(f"{tuple(values.shape)}|{values.dtype}|".encode())
    h.update(rows.detach().cpu().long().contiguous().numpy().tobytes())
    v = values.detach().cpu().contiguous()
    h.update(v.flatten().view(torch.uint8).numpy().tobytes() if v.numel() else b"")
    return h.hexdigest()


class _Target:
    """The edited rows of one object: ``W_out[layer]`` of a model (through the capture layer) or a transcoder's
    ``W_dec``. ``read()`` copies the rows ``[n_rows, d]`` in the weight's dtype; ``write(values)`` puts them in
    place in ONE tensor operation (``index_copy_``), so an interruption leaves all rows written or none."""

    def __init__(self, edit: "Edit", model, transcoder: Transcoder | None) -> None:
        self.rows = edit.rows.detach().cpu().long()
        if edit.site == "transcoder":
            if transcoder is None:
                raise ValueError("this edit changes a transcoder's W_dec: pass transcoder=")
            if tuple(transcoder.W_dec.shape) != tuple(edit.delta.shape):
                raise ValueError(f"transcoder W_dec {tuple(transcoder.W_dec.shape)} does not match the edit "
                                 f"{tuple(edit.delta.shape)}")
            self.owner, self.layer = transcoder, None
        else:
            if model is None:
                raise ValueError("this edit changes the model's W_out: pass model=")
            w = model.weight("W_out")
            if not 0 <= edit.layer < w.shape[0] or tuple(w.shape[1:]) != tuple(edit.delta.shape):
                raise ValueError(f"the model's W_out {tuple(w.shape)} does not match the edit (layer {edit.layer}, "
                                 f"delta {tuple(edit.delta.shape)})")
            self.owner, self.layer = model, edit.layer
        if self.rows.numel() and not (0 <= int(self.rows.min()) and int(self.rows.max()) < edit.delta.shape[0]):
            raise ValueError(f"the edit's rows lie outside 0..{edit.delta.shape[0] - 1}")

    def read(self) -> torch.Tensor:
        if self.layer is None:
            return self.owner.W_dec.detach()[self.rows.to(self.owner.W_dec.device)].cpu().clone()
        return self.owner.weight("W_out")[self.layer][self.rows].cpu()

    def write(self, values: torch.Tensor) -> None:
        if self.layer is None:
            w = self.owner.W_dec
            with torch.no_grad():
                w.index_copy_(0, self.rows.to(w.device), values.to(w.device))
        else:
            self.owner.write_weight_rows("W_out", self.layer, self.rows, values)


@dataclass
class Edit(Result):
    """One weight edit: ``W ← W + delta`` on a site (``"mlp"``: ``W_out[layer]``; ``"transcoder"``: its
    ``W_dec``). ``delta [d_key, d_model]`` (TL orientation, rows = keys/features); ``rows``: the rows it
    changes; ``k_star``, ``v_star``, ``u``; ``residual = ‖k W' + b − v*‖ / ‖v*‖`` after the edit at the key ``k``
    the right vector was solved at (``log["right_vector_key"]``: ``k*``, or the plain prompt's key for ROME on
    an MLP; ``log["residual_k_star"]`` is the same at ``k*``).

    **State.** An edit knows the weights it was computed on: ``weights_before`` (the edited rows, in the
    weight's dtype) and ``fingerprint_before`` / ``fingerprint_after`` (SHA-256 of those rows before and of
    the rows applying it leaves, ``before + delta`` rounded once to the weight's dtype). So the weights
    themselves say whether an object holds the edit: :meth:`holds`. :meth:`apply` writes the edited rows
    only onto the weights the edit was computed on; :meth:`revert` writes ``weights_before`` back (bit for bit)
    only where the edit is held; each refuses otherwise, changing nothing. Each ends in one tensor write,
    so an interruption at any point leaves the rows either as before or as edited, never between, and
    :attr:`applied` (read from the weights, not a stored flag) always agrees with them. ``applied`` is
    about the model or transcoder this edit was last applied to or reverted on; a saved edit loads as not
    applied (``applied`` saved by older versions is ignored); ``edit.holds(model)`` tells about any model.
    Edits saved before these records existed record ``weights_before`` on their first :meth:`apply`."""

    kind = "edit"
    method: str
    site: str
    layer: int
    request: dict
    delta: torch.Tensor
    rows: torch.Tensor
    k_star: torch.Tensor
    v_star: torch.Tensor
    u: torch.Tensor
    residual: float
    tau: float | None = None
    n_active: int = 0
    d_key: int = 0
    log: dict = field(default_factory=dict)
    applied: InitVar[bool] = False
    weights_before: torch.Tensor | None = None
    fingerprint_before: str = ""
    fingerprint_after: str = ""

    def __post_init__(self, applied: bool) -> None:
        # a saved edit loads as not applied: ``applied`` is read from the weights it was last applied to (the
        # ``applied`` argument, written by older versions, is ignored)
        self._holder = None
        if self.weights_before is None:
            if self.fingerprint_before or self.fingerprint_after:
                raise ValueError("an edit with fingerprints needs the weights_before they were taken of")
            return
        wb = torch.as_tensor(self.weights_before)
        if tuple(wb.shape) != (len(self.rows), *self.delta.shape[1:]):
            raise ValueError(f"weights_before has shape {tuple(wb.shape)}; expected the edited rows "
                             f"{(len(self.rows), *self.delta.shape[1:])}")
        given = (self.fingerprint_before, self.fingerprint_after)
        self._set_before(wb)
        if any(g and g != h for g, h in zip(given, (self.fingerprint_before, self.fingerprint_after))):
            raise ValueError("the edit's fingerprints do not match its weights_before and delta (a damaged or "
                             "edited file)")

    @property
    def n_changed(self) -> int:
        """Number of changed rows (decoder columns in the paper's ``[d_model, d_tc]`` orientation)."""
        return int(len(self.rows))

    def _edited(self, before: torch.Tensor) -> torch.Tensor:
        """The edited rows: ``before + delta`` added at float64 and rounded once to the weight's dtype."""
        d = self.delta.detach().cpu()[self.rows.detach().cpu().long()]
        return (before.double() + d.double()).to(before.dtype)

    def record_before(self, weight: torch.Tensor) -> "Edit":
        """Record the weights this edit is computed on: ``weight [d_key, d_model]`` (the whole edited matrix in
        its own dtype, e.g. ``model.weight("W_out")[layer]``); sets ``weights_before`` and both fingerprints."""
        if tuple(weight.shape) != tuple(self.delta.shape):
            raise ValueError(f"weight {tuple(weight.shape)} does not match the edit's delta {tuple(self.delta.shape)}")
        self._set_before(weight.detach().cpu()[self.rows.detach().cpu().long()].clone())
        return self

    def _set_before(self, wb: torch.Tensor) -> None:
        """``weights_before`` = ``wb`` (the edited rows) and the fingerprints of it and of the edited rows; the
        fingerprints are assigned last, together, so an interruption never leaves them describing other rows."""
        rows = self.rows.detach().cpu().long()
        fps = (_fingerprint(rows, wb), _fingerprint(rows, self._edited(wb)))
        self.weights_before = wb
        self.fingerprint_before, self.fingerprint_after = fps

    def _state(self, target: _Target) -> str:
        """``"edited"``, ``"before"`` (the weights it was computed on) or ``"other"`` for ``target`` now."""
        fp = _fingerprint(target.rows, target.read())
        if self.fingerprint_after and fp == self.fingerprint_after:
            return "edited"
        if self.fingerprint_before and fp == self.fingerprint_before:
            return "before"
        return "other"

    def holds(self, model=None, transcoder: Transcoder | None = None) -> bool:
        """Whether ``model``'s ``W_out[layer]`` (or ``transcoder``'s ``W_dec``) holds this edit now: its edited
        rows are bit for bit what :meth:`apply` leaves (by fingerprint). ``False`` for an edit saved before
        fingerprints were recorded and never applied since."""
        return self._state(_Target(self, model, transcoder)) == "edited"

    def _applied(self) -> bool:
        """Whether the model or transcoder this edit was last applied to or reverted on holds it now (read
        from its weights; ``False`` for a loaded edit until it is applied)."""
        ref = self._holder
        owner = ref() if ref is not None else None
        if owner is None:
            return False
        return self.holds(transcoder=owner) if self.site == "transcoder" else self.holds(model=owner)

    def _hold(self, owner) -> None:
        import weakref
        self._holder = weakref.ref(owner)

    @torch.no_grad()
    def apply(self, model=None, transcoder: Transcoder | None = None) -> "Edit":
        """Write the edited rows (``before + delta``, rounded once) in place. Refused, changing nothing, when
        the weights already hold the edit or are not the weights it was computed on (another edit of the same
        rows applied since, or another model)."""
        target = _Target(self, model, transcoder)
        now = target.read()
        fp = _fingerprint(target.rows, now)
        if self.fingerprint_after and fp == self.fingerprint_after:
            raise RuntimeError("edit already applied: this model's edited rows are exactly as the edit leaves them; "
                               "revert it first")
        if self.fingerprint_before and fp != self.fingerprint_before:
            raise RuntimeError(f"cannot apply the edit: the {len(target.rows)} rows it changes are not the weights it "
                               "was computed on (another edit of these rows is applied, or this is another model); "
                               "revert that edit first, or compute the edit on this model")
        if not self.fingerprint_before:  # saved before weights were recorded: these rows are its starting point
            self._set_before(now)
        edited = self._edited(now)
        self._hold(target.owner)
        target.write(edited)  # one write: an interruption leaves the rows as before or as edited
        return self

    @torch.no_grad()
    def revert(self, model=None, transcoder: Transcoder | None = None) -> "Edit":
        """Write the rows saved before the edit back, bit for bit. Refused, changing nothing, unless the weights
        hold the edit exactly (:meth:`holds`)."""
        target = _Target(self, model, transcoder)
        state = self._state(target)
        if state != "edited":
            why = ("its rows are the weights before the edit" if state == "before" else
                   "its rows are neither the edited nor the original weights (changed since, or another model)"
                   if self.fingerprint_after else "this edit has no record of the weights it leaves (saved before "
                   "edits recorded them); reload the model instead")
            raise RuntimeError(f"edit is not applied to this {'transcoder' if self.site == 'transcoder' else 'model'}: "
                               f"{why}; nothing was changed")
        before = torch.as_tensor(self.weights_before)
        if _fingerprint(target.rows, before) != self.fingerprint_before:
            raise RuntimeError("the edit's saved weights_before do not match its fingerprint_before (a damaged "
                               "or edited file); nothing was changed")
        self._hold(target.owner)
        target.write(before)  # one write: an interruption leaves the rows as edited or as before
        return self

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame([{"method": self.method, "site": self.site, "layer": self.layer, "tau": self.tau,
                              "n_changed": self.n_changed, "d_key": self.d_key,
                              "frac_changed": self.n_changed / max(self.d_key, 1),
                              "delta_norm": float(self.delta.norm()), "residual": self.residual,
                              **{f"request_{k}": v for k, v in self.request.items()}}])

    def figure(self):
        import plotly.graph_objects as go
        norms = self.delta.norm(dim=1)
        fig = go.Figure(go.Bar(x=self.rows.tolist(), y=norms[self.rows].tolist()))
        fig.update_layout(title=f"{self.method}: {self.n_changed} rows changed", xaxis_title="row (feature/neuron)",
                          yaxis_title="‖ΔW row‖")
        return fig


# a property, set after the dataclass is built: ``applied`` is also the (ignored) init argument of older saves
Edit.applied = property(Edit._applied, doc=Edit._applied.__doc__)  # type: ignore[assignment, method-assign]


def _mask_rows(k_star: torch.Tensor, tau: float | None, ablate: bool) -> torch.Tensor:
    if tau is None or tau < 0:
        keep = torch.ones_like(k_star, dtype=torch.bool)
    else:
        keep = (k_star > 0) & (k_star >= tau)
    if ablate:
        keep = ~keep
    return keep


def left_vector(C: torch.Tensor, k: torch.Tensor, eps: float = 0.0) -> tuple[torch.Tensor, str]:
    """ROME's left vector ``u = (C + εI)⁻¹ k`` normalised to unit norm (``C [d, d]``, ``k [d]`` → ``[d]``), and
    the least-squares driver that produced it.

    Solved in float64 by least squares with torch's CPU default driver (``gelsy``, rank-revealing QR; the
    driver of every measured run). On a singular ``C`` of low rank stored in float32 (a toy's layer-0
    transcoder: rank ~135 of 1024) ``gelsy`` returned an all-zero solution, which normalised to NaN; then
    the SVD minimum-norm solution (``gelsd``, ``C⁺k``) is used instead. Note: on a singular ``C`` the two drivers
    can differ (their rank cut-offs differ; on SmolLM2's layer-8 transcoder ``C`` the cosine between them was
    0.63 for a random key in C's range), i.e. ROME's ``u`` is ill-determined there; TCPE's mask limits the
    update to the key's own features either way. Raises ``ValueError`` when ``k`` has no component in the range
    of ``C + εI`` (``‖(C + εI) u‖ ≤ 1e-6 ‖k‖`` for the solution ``u`` of both drivers: an explicit test, not an
    exact zero, which round-off does not guarantee); ``eps > 0`` (``EditConfig.mom2_eps``) is the documented
    regularisation.
    """
    A = C.double() + eps * torch.eye(len(C), dtype=torch.float64)
    k64 = k.double()
    for driver in ("gelsy", "gelsd"):
        u = torch.linalg.lstsq(A, k64[:, None], driver=driver).solution[:, 0]
        # ``A u`` is k's projection on A's range: ~0 (round-off, e.g. 1e-13) when k lies in the null space
        if bool(torch.isfinite(u).all()) and bool((A @ u).norm() > 1e-6 * k64.norm()):
            return (u / u.norm()).float(), driver
    raise ValueError("(C + εI)⁺k* is zero or not finite: the key has no component in the range of the second "
                     "moment (features never active in C's text); estimate C from more varied text or set "
                     "EditConfig(mom2_eps=...) > 0")


@torch.no_grad()
def moment_diagnostics(C: torch.Tensor, keys: torch.Tensor, eps_rels: Sequence[float] = (0.0, 1e-2),
                       tiny: float = 1e-6) -> dict:
    """How well-conditioned a second moment ``C [d, d]`` is for the keys ``keys [n, d]`` it will be solved
    against (ROME's ``u = (C + ε I)⁻¹ k*``).

    Returns ``d``, ``mean_diag``, ``n_never_active`` (features with ``C_aa = 0``: never active in C's text),
    ``eig_min`` / ``eig_max`` of ``C``, the same on the block of features active in the text (``eig_min_active``,
    ``cond_active``), ``n_tiny_active`` (eigenvalues of that block below ``tiny · mean_diag``) and, per
    ``eps_rel`` (ridge ``ε = eps_rel · mean(diag C)``, as ``EditConfig.mom2_eps_rel``), the per-key
    ``cos_uk = uᵀk*/‖k*‖`` (:func:`left_vector`) and ``n_blind`` (key features never active in C's text).
    """
    C = C.double()
    diag = torch.diagonal(C)
    act = diag > 0
    md = float(diag.mean())
    ev = torch.linalg.eigvalsh(C)
    ev_a = torch.linalg.eigvalsh(C[act][:, act]) if bool(act.any()) else ev[:0]
    out = {"d": len(C), "mean_diag": md, "n_never_active": int((~act).sum()),
           "eig_min": float(ev[0]), "eig_max": float(ev[-1]),
           "eig_min_active": float(ev_a[0]) if len(ev_a) else float("nan"),
           "cond_active": float(ev_a[-1] / ev_a[0]) if len(ev_a) and float(ev_a[0]) > 0 else float("inf"),
           "n_tiny_active": int((ev_a < tiny * md).sum()),
           "n_blind": [int(((k != 0) & ~act).sum()) for k in keys]}
    for e in eps_rels:
        cos = []
        for k in keys:
            u, _ = left_vector(C, k.double(), e * md)
            cos.append(float(u.double() @ k.double() / k.double().norm().clamp_min(1e-30)))
        out[f"cos_uk_ridge{e:g}"] = cos
    return out


def rank_one(site: _Site, req: EditRequest, C: torch.Tensor, config: EditConfig | None = None,
             tau: float | None = None, ablate: bool = False, method: str = "rome",
             templates: Sequence[str] | None = None) -> Edit:
    """The ROME / TCPE computation on ``site`` (module docstring); does not apply the edit."""
    cfg = config or EditConfig()
    templates = list(templates) if templates is not None else context_templates(site.model, cfg)
    k = compute_key(site, req, templates, cfg.fact_token)
    if C.shape != (k.numel(), k.numel()):
        raise ValueError(f"C has shape {tuple(C.shape)}, expected ({k.numel()}, {k.numel()}) for {site.key}")
    if not bool(torch.isfinite(C).all()):
        raise ValueError(f"the second moment C of {site.key} has non-finite entries")
    v_star, log = compute_v(site, req, templates, cfg)
    W, b = site.W(), site.b()
    if not bool(k.abs().sum() > 0):
        raise RuntimeError(f"k* = 0 at {site.key}: no key feature is active at the edit position; a rank-one "
                           "edit of this site cannot change it")
    eps = cfg.mom2_eps + cfg.mom2_eps_rel * float(torch.diagonal(C).double().mean())
    u, driver = left_vector(C, k, eps)
    log.update(lstsq_driver=driver, n_blind=int(((k != 0) & ~(torch.diagonal(C) > 0)).sum()),
               cos_uk=float(u @ k / k.norm().clamp_min(1e-30)))
    key_r = cfg.right_vector_key or ("prompt" if isinstance(site, MLPSite) else "k_star")
    # ROME evaluates r at the plain prompt's key (its get_module_input_output_at_word); TCPE's code at k*
    k_r = k if key_r == "k_star" else compute_key(site, req, ["{}"], cfg.fact_token)
    denom = float(u @ k_r)
    if abs(denom) < 1e-12:
        raise RuntimeError(f"uᵀk = 0 at the right vector's key ({key_r}): cannot build a rank-one update")
    r = (v_star - (k_r @ W + b)) / denom
    delta = u[:, None] * r[None, :]
    if not bool(torch.isfinite(delta).all()):
        raise RuntimeError(f"non-finite rank-one update at {site.key} (uᵀk* = {denom:.3g}, |v*| = "
                           f"{float(v_star.norm()):.3g}): C is too degenerate on the key's support")
    keep = _mask_rows(k, tau, ablate)
    delta = delta * keep[:, None].float()
    rows = keep.nonzero().flatten()
    out = k_r @ (W + delta) + b
    log.update(right_vector_key=key_r, residual_k_star=float((k @ (W + delta) + b - v_star).norm()
                                                          / v_star.norm().clamp_min(1e-12)))
    return Edit(method=method, site=site.kind, layer=site.layer,
                request={"prompt": req.prompt, "subject": req.subject, "target": req.target},
                delta=delta, rows=rows, k_star=k, v_star=v_star, u=u,
                residual=float((out - v_star).norm() / v_star.norm().clamp_min(1e-12)),
                tau=tau, n_active=int((k > 0).sum()), d_key=len(k), log=log).record_before(site.raw_W())


def restrict(edit: Edit, tau: float | None, ablate: bool = False, site: _Site | None = None) -> Edit:
    """The TCPE mask of an unmasked edit: ``edit.delta`` with the rows outside ``S = {a : k*_a > 0, k*_a ≥ τ}``
    zeroed (``ablate``: inside). Same ``k*``, ``v*``, ``u`` as ``edit``, so several τ share one ``compute_v``
    (:func:`rank_one` with ``tau`` gives the same delta). ``site``: the unedited site, for the exact residual;
    without it the residual is ``‖k*·ΔW_removed‖/‖v*‖`` added to ``edit.residual`` (exact up to the full
    edit's own residual)."""
    keep = _mask_rows(edit.k_star, tau, ablate)
    delta = edit.delta * keep[:, None].float()
    if site is not None:
        out = edit.k_star @ (site.W() + delta) + site.b()
        res = float((out - edit.v_star).norm() / edit.v_star.norm().clamp_min(1e-12))
    else:
        res = edit.residual + float((edit.k_star @ (edit.delta - delta)).norm() / edit.v_star.norm().clamp_min(1e-12))
    method = "tcpe_ablate" if ablate else ("tcpe" if tau is not None and tau >= 0 else edit.method)
    out = Edit(method=method, site=edit.site, layer=edit.layer, request=dict(edit.request), delta=delta,
               rows=keep.nonzero().flatten(), k_star=edit.k_star, v_star=edit.v_star, u=edit.u, residual=res,
               tau=tau, n_active=edit.n_active, d_key=edit.d_key, log=dict(edit.log))
    if site is not None:
        return out.record_before(site.raw_W())
    if edit.weights_before is not None and len(edit.rows):  # the same starting point, on a subset of its rows
        have = edit.rows.detach().cpu().long()
        at = torch.searchsorted(have, out.rows.cpu()).clamp_max(len(have) - 1)
        if bool((have[at] == out.rows.cpu()).all()):
            out._set_before(torch.as_tensor(edit.weights_before)[at].clone())
    return out


def default_texts(verses_per_text: int = 10) -> list[str]:
    """The built-in corpus of :func:`default_second_moment`: the King James Bible of :func:`interp.data.kjv_text`
    (Ruth held out), as consecutive passages of ``verses_per_text`` verses (2,434 texts of up to ~1,300 tokens;
    989k tokens with SmolLM2's tokenizer). ROME's corpus is Wikipedia, which this toolkit cannot fetch offline;
    any real text of the model's language can be passed instead (``texts=`` of :func:`rome` / :func:`tcpe`)."""
    from interp.data import text_passages
    return text_passages(None, verses_per_text)  # every passage, in book order


def default_second_moment(site: _Site, config: EditConfig | None = None, texts: Sequence[str] | None = None,
                          max_length: int | None = None, root=None) -> torch.Tensor:
    """``C`` of ``site`` from ``config.mom2_n_samples`` texts of the built-in corpus (:func:`default_texts`;
    ``texts`` replaces it), computed once per (model weights, layer, key, counts, corpus) and stored as a
    resumable stage (:class:`interp.stages.Stages` ``"editing/mom2"`` under the interp cache folder), so
    later calls, in any process, read it back — ROME's ``layer_stats`` cache. The context templates of
    ``config`` are stored in the same run (stage ``"templates"``) and seeded (:func:`context_templates`).

    Cost: one forward pass up to the site's layer over every counted token: the whole built-in corpus (all
    2,434 texts, ~1M tokens, whenever ``mom2_n_samples ≥ 2,434``; the default is ROME's 100,000) —
    ~1 h of 2 shared CPU cores for SmolLM2-135M (docs/editing.md), seconds for a tiny test model; set
    ``EditConfig(mom2_n_samples=...)`` lower for a quicker, noisier ``C``. As ROME's cache, the stored ``C`` is
    keyed by the model's name and the site's own input weights, not by earlier layers: after edits of earlier
    layers it is the unedited model's ``C`` (ROME reuses it the same way).
    """
    from interp.stages import Stages
    cfg = config or EditConfig()
    corpus = list(texts) if texts is not None else default_texts()
    key = {"schema": 1, "model": _model_identity(site.model), "site": _site_digest(site), "kind": site.kind,
           "layer": site.layer, "n_samples": cfg.mom2_n_samples, "max_length": max_length,
           "corpus": hashlib.sha1("\x00".join(corpus).encode()).hexdigest(),
           "templates": repr(_template_key(None, cfg)[1:])}
    st = Stages("editing/mom2", key, root=root)
    C = st("C", lambda: {"C": second_moment(site, corpus, n_samples=cfg.mom2_n_samples, max_length=max_length)})["C"]
    tkey = _template_key(site.model, cfg)
    if tkey not in _TEMPLATES:
        _TEMPLATES[tkey] = list(st("templates", lambda: {"templates": context_templates(site.model, cfg)})["templates"])
    return torch.as_tensor(C).float()


def rome(model, request: EditRequest, layer: int, C: torch.Tensor | None = None, texts: Sequence[str] = (),
         config: EditConfig | None = None, templates: Sequence[str] | None = None, apply: bool = True) -> Edit:
    """ROME on MLP ``layer`` (key: ``mlp.hook_post``), with ROME's official hyper-parameters by default
    (:class:`EditConfig`). ``C``: given, else from ``texts`` (the first ``config.mom2_n_samples``), else from
    the built-in corpus, computed once per model and layer and cached (:func:`default_second_moment`).
    Applied unless ``apply=False``."""
    cfg = config or EditConfig()
    site = MLPSite(model, layer)
    if C is None:
        C = second_moment(site, texts, n_samples=cfg.mom2_n_samples) if texts else default_second_moment(site, cfg)
    edit = rank_one(site, request, C, cfg, tau=None, method="rome", templates=templates)
    return edit.apply(model) if apply else edit


def tcpe(model, request: EditRequest, layer: int, transcoder: Transcoder | None = None, tau: float = 0.1,
         C: torch.Tensor | None = None, texts: Sequence[str] = (), config: EditConfig | None = None,
         templates: Sequence[str] | None = None, ablate: bool = False, apply: bool = True,
         upd_decay: float = 1.0) -> Edit:
    """TCPE: the rank-one update of ``transcoder.W_dec`` restricted to features with ``k*_a ≥ tau``
    (``tau < 0``: unmasked ROME on the transcoder; ``ablate``: only the other features), scaled by
    ``1 / upd_decay`` (TCPE's ``apply_tcpe_to_model``; ``run_tcpe.py``'s default 1.0). ``config`` defaults to
    TCPE's official hyper-parameters (:meth:`EditConfig.tcpe`); ``C`` as in :func:`rome`. The transcoder must be
    spliced (:func:`interp.editing.splice`) whenever the edited model is used. Several edits: :func:`tcpe_batch`.
    ``transcoder=None``: :func:`interp.editing.default_transcoder` (trained once per model and layer on the
    built-in corpus and cached; the same object on every call, so splice that one)."""
    cfg = config or EditConfig.tcpe()
    if transcoder is None:
        transcoder = default_transcoder(model, layer)
    site = TranscoderSite(model, layer, transcoder)
    if C is None:
        C = second_moment(site, texts, n_samples=cfg.mom2_n_samples) if texts else default_second_moment(site, cfg)
    method = "rome_tc" if tau is not None and tau < 0 else ("tcpe_ablate" if ablate else "tcpe")
    edit = rank_one(site, request, C, cfg, tau=tau, ablate=ablate, method=method, templates=templates)
    if upd_decay != 1.0:
        edit = scale_edit(edit, 1.0 / upd_decay, site)
    return edit.apply(transcoder=transcoder) if apply else edit


def scale_edit(edit: Edit, factor: float, site: _Site) -> Edit:
    """``edit`` with ``delta`` multiplied by ``factor`` (TCPE's ``1 / upd_decay``); ``site``: the unedited site
    (for the residual and ``weights_before``)."""
    if not (isinstance(factor, (int, float)) and factor > 0):
        raise ValueError(f"the scale factor must be a number > 0, got {factor!r}")
    delta = edit.delta * factor
    k_v = edit.k_star @ (site.W() + delta) + site.b()
    res = float((k_v - edit.v_star).norm() / edit.v_star.norm().clamp_min(1e-12))
    out = Edit(method=edit.method, site=edit.site, layer=edit.layer, request=dict(edit.request), delta=delta,
               rows=edit.rows, k_star=edit.k_star, v_star=edit.v_star, u=edit.u, residual=res, tau=edit.tau,
               n_active=edit.n_active, d_key=edit.d_key, log={**edit.log, "scale": factor})
    return out.record_before(site.raw_W())


def tcpe_batch(model, requests: Sequence[EditRequest], layer: int, transcoder: Transcoder | None = None,
               tau: float = 0.1,
               C: torch.Tensor | None = None, texts: Sequence[str] = (), config: EditConfig | None = None,
               templates: Sequence[str] | None = None, ablate: bool = False, upd_decay: float | Sequence[float] = 1.1,
               apply: bool = True) -> Edit:
    """TCPE's multi-edit scheme (``tcpe_multineuron.apply_tcpe`` with ``sweep/run_tcpe.sh``'s ``upd_decay`` 1.1):
    every request's masked update ``ΔW_i`` is computed on the UNEDITED transcoder, and one edit adds
    ``Σ_i ΔW_i / upd_decay_i`` (``upd_decay``: one value or one per request). (:func:`edit_batch` instead edits
    sequentially, each edit computed on the weights the previous ones left: ROME's ``apply_rome_to_model``.)
    The returned :class:`Edit` has ``method="tcpe_sum"``; ``k_star``/``v_star``/``u`` are those of the first
    request, ``log["edits"]`` lists every request's rows, residual and scale."""
    reqs = list(requests)
    if not reqs:
        raise ValueError("tcpe_batch needs at least one request")
    decays = [float(upd_decay)] * len(reqs) if isinstance(upd_decay, (int, float)) else [float(d) for d in upd_decay]
    if len(decays) != len(reqs) or any(not d > 0 for d in decays):
        raise ValueError(f"upd_decay must be a number > 0 or one per request ({len(reqs)}), got {upd_decay!r}")
    cfg = config or EditConfig.tcpe()
    if transcoder is None:  # as in tcpe: the cached default transcoder of this model and layer
        transcoder = default_transcoder(model, layer)
    site = TranscoderSite(model, layer, transcoder)
    if C is None:
        C = second_moment(site, texts, n_samples=cfg.mom2_n_samples) if texts else default_second_moment(site, cfg)
    edits = [tcpe(model, r, layer, transcoder, tau=tau, C=C, config=cfg, templates=templates, ablate=ablate,
                  apply=False) for r in reqs]
    delta = sum(e.delta / d for e, d in zip(edits, decays))
    rows = (delta != 0).any(1).nonzero().flatten()
    first = edits[0]
    log = {"edits": [{"request": e.request, "rows": e.rows.tolist(), "residual": e.residual, "upd_decay": d}
                     for e, d in zip(edits, decays)]}
    out = Edit(method="tcpe_sum", site="transcoder", layer=layer,
               request={k: " | ".join(e.request[k] for e in edits) for k in ("prompt", "subject", "target")},
               delta=delta, rows=rows, k_star=first.k_star, v_star=first.v_star, u=first.u,
               residual=max(e.residual for e in edits), tau=tau, n_active=first.n_active, d_key=first.d_key,
               log=log).record_before(site.raw_W())
    return out.apply(transcoder=transcoder) if apply else out


# ====================================================================== constrained fine-tuning baseline
@dataclass
class FineTuneConfig:
    """FT-L (ROME paper's constrained fine-tuning baseline): Adam on ``ΔW`` of ``W_out[l]`` minimising the
    target NLL on the rewriting prompts, with ``‖ΔW‖∞ ≤ norm_constraint`` enforced after every step."""

    steps: int = 25
    lr: float = 5e-3
    norm_constraint: float = 5e-3

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be a positive integer, got {self.steps!r}")
        for name in ("lr", "norm_constraint"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"{name} must be a number > 0, got {v!r}")


def fine_tune(model, request: EditRequest, layer: int, config: FineTuneConfig | None = None,
              templates: Sequence[str] | None = None, apply: bool = True) -> Edit:
    """Constrained fine-tuning of MLP ``layer``'s output weights; the candidate weight change acts through an
    intervention (``out += mlp.hook_post @ ΔW``) during optimisation, then becomes an :class:`Edit`."""
    cfg = config or FineTuneConfig()
    site = MLPSite(model, layer)
    templates = list(templates) if templates is not None else ["{}"]
    batch, idx, tpos, tgt = _rewrite_batch(model, request, templates, ())
    n = len(templates)
    W = site.W()
    dW = torch.zeros_like(W, requires_grad=True)
    stash: dict = {}
    opt = torch.optim.Adam([dW], lr=cfg.lr)
    hooks = {site.key: lambda t, ctx: stash.__setitem__("h", t) or None,
             site.out: lambda t, ctx: t + (stash["h"].float() @ dW).to(t.dtype)}
    log = {"nll": []}
    with model.intervene(hooks):
        for _ in range(cfg.steps):
            lp = model.forward_with_grad(batch).float().log_softmax(-1)
            nll = -lp[torch.arange(n)[:, None], tpos, :].gather(-1, tgt.expand(n, -1)[..., None]).mean()
            log["nll"].append(float(nll.detach()))
            (g,) = torch.autograd.grad(nll, [dW])
            dW.grad = g
            opt.step()
            with torch.no_grad():
                dW.clamp_(-cfg.norm_constraint, cfg.norm_constraint)
    delta = dW.detach()
    k = compute_key(site, request, ["{}"])
    rows = (delta != 0).any(1).nonzero().flatten()
    edit = Edit(method="ft", site="mlp", layer=layer,
                request={"prompt": request.prompt, "subject": request.subject, "target": request.target},
                delta=delta, rows=rows, k_star=k, v_star=k @ (W + delta) + site.b(), u=torch.zeros(len(k)),
                residual=0.0, n_active=int((k > 0).sum()), d_key=len(k), log=log).record_before(site.raw_W())
    return edit.apply(model) if apply else edit


def edit_batch(fn, requests: Sequence[EditRequest], *args, **kwargs) -> list[Edit]:
    """Edit ``requests`` one after another with ``fn`` (``rome``/``tcpe``/``fine_tune``), each applied
    before the next is computed (sequential editing)."""
    return [fn(args[0], r, *args[1:], **kwargs) for r in requests]


__all__ = ["EditRequest", "EditConfig", "Edit", "FineTuneConfig", "MLPSite", "TranscoderSite", "context_templates",
           "compute_key", "second_moment", "second_moments", "default_texts", "default_second_moment", "compute_v",
           "kl_term", "weight_decay_term", "left_vector", "rank_one", "restrict", "scale_edit", "rome", "tcpe",
           "tcpe_batch", "fine_tune", "edit_batch"]
