"""``Q(w)`` of Rofin et al. on a real LM: SAE features of one residual layer, and the text domains the
extreme-``Q`` features prefer.

Recipe (issue #18, validation 3; the paper applies ``Q`` to Gemma-2 SAE features and finds the extreme-``Q``
ones enriched in code and formal text):

1. Real text of several domains (:func:`domain_corpora`: Python standard-library source = ``code``, the King
   James Bible = ``scripture``, the licence texts in ``/usr/share/common-licenses`` = ``legal``, the refusal
   instruction set = ``instructions``), tokenised into contexts of equal length, one domain per context.
2. Harvest the residual stream at one site (``interp.store.harvest``, which stops the forward after that layer)
   and train a sae-lens SAE on it (``interp.store.train_sae``).
3. ``Q`` of each chosen feature's decoder direction (:func:`interp.dynamics.q_proxy`: projection at one position
   of held-out contexts of all domains).
4. Each feature's domain preference: its share of total activation mass per domain (on the harvested rows),
   divided by that domain's share of tokens (1 = no preference). Extreme-``Q`` features (top / bottom
   ``extreme`` fraction) are compared with all measured features.

Everything runs on CPU at a bounded size; :func:`run_q_domains` returns a :class:`QDomainResult` (the recipe runs
:func:`harvest_domains` and :func:`analyse_q_domains` as two stages). The method is
:func:`interp.dynamics.q_proxy`; moved here from ``interp.dynamics.q_domains`` (issue #31).
"""
from __future__ import annotations

import dataclasses
import sysconfig
from pathlib import Path

import numpy as np
import torch

from interp.results import Result

DOMAINS = ("code", "scripture", "legal", "instructions")


def domain_corpora(max_chars: int = 400_000) -> dict[str, str]:
    """Real text per domain (each at most ``max_chars`` characters; deterministic)."""
    std = Path(sysconfig.get_paths()["stdlib"])
    code, n = [], 0
    for f in sorted(std.glob("*.py")):
        t = f.read_text(errors="ignore")
        code.append(t)
        n += len(t)
        if n > max_chars:
            break
    from interp.data import kjv_text, refusal_instructions
    lic = Path("/usr/share/common-licenses")
    legal = "\n\n".join(p.read_text(errors="ignore") for p in sorted(lic.iterdir()) if p.is_file()) if lic.is_dir() else ""
    instr = "\n".join(i.text for i in refusal_instructions())
    out = {"code": "\n".join(code), "scripture": kjv_text(), "legal": legal, "instructions": instr}
    return {k: v[:max_chars] for k, v in out.items() if v}


def domain_contexts(tokenizer, texts: dict[str, str], n_ctx: int, length: int) -> tuple[torch.Tensor, np.ndarray]:
    """``(tokens [n_domains·n_ctx, length], domain index [n_domains·n_ctx])``: consecutive non-overlapping
    chunks of each domain's token stream (no BOS), domains interleaved context by context."""
    per = []
    for name, t in texts.items():
        ids = torch.tensor(tokenizer(t)["input_ids"], dtype=torch.long)
        k = min(n_ctx, ids.numel() // length)
        if k < n_ctx:
            raise ValueError(f"domain {name!r} has only {k} contexts of {length} tokens, need {n_ctx}")
        per.append(ids[: n_ctx * length].view(n_ctx, length))
    toks = torch.stack(per, 1).reshape(-1, length)                        # interleaved
    dom = np.tile(np.arange(len(per)), n_ctx)
    return toks, dom


@dataclasses.dataclass
class QDomainResult(Result):
    """``features`` ``[n]`` (SAE latent ids), ``q`` ``[n]``, ``domain_pref`` ``[n, n_domains]`` (activation-mass share
    over token share), ``domains``; ``summary`` rows compare the extreme-``Q`` groups with all features."""

    site: str
    position: int
    domains: list[str]
    features: torch.Tensor
    q: torch.Tensor
    domain_pref: torch.Tensor
    sae_stats: dict
    summary: list[dict]

    kind = "q_domains"

    def to_frame(self):
        import pandas as pd
        df = pd.DataFrame({"feature": self.features.numpy(), "Q": self.q.numpy()})
        for j, d in enumerate(self.domains):
            df[f"pref_{d}"] = self.domain_pref[:, j].numpy()
        df["top_domain"] = [self.domains[j] for j in self.domain_pref.argmax(1).tolist()]
        return df

    def figure(self):
        import plotly.express as px
        return px.box(self.to_frame(), x="top_domain", y="Q", points="all", log_y=True,
                      title=f"Q(w) of SAE features at {self.site} by preferred domain")


@dataclasses.dataclass
class QDomainsConfig:
    """The Q(w)-by-domain run (issue #18 validation 3; defaults: the run of docs/dynamics.md). ``spec``: a model
    ``interp.load`` reads, or ``"tiny-gpt2"`` (a random 2-layer GPT-2 with a byte tokenizer, for the quick
    preset). ``n_ctx`` harvested contexts of ``length`` tokens per domain (BOS prepended); ``q_contexts`` held-out
    contexts per domain of ``q_length`` tokens for ``Q`` at ``q_position``; ``n_features`` alive SAE features drawn
    at random (seeded); ``extreme``: the fraction of features in the top / bottom ``Q`` groups."""

    spec: str = "zoo:smollm2-135m"
    layer: int = 8
    n_ctx: int = 100
    length: int = 64
    d_sae: int = 1024
    k: int = 32
    sae_steps: int = 600
    n_features: int = 48
    q_contexts: int = 2
    q_length: int = 24
    q_position: int = 12
    extreme: float = 0.2
    max_chars: int = 400_000
    seed: int = 0

    def __post_init__(self) -> None:
        for f in ("n_ctx", "length", "d_sae", "k", "sae_steps", "n_features", "q_contexts", "q_length", "max_chars"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"QDomainsConfig.{f} must be a positive integer, got {v!r}")
        if not 0 < self.q_position < self.q_length:
            raise ValueError(f"QDomainsConfig.q_position must be in 1..q_length-1, got {self.q_position}")
        if not 0 < self.extreme <= 0.5:
            raise ValueError(f"QDomainsConfig.extreme must be in (0, 0.5], got {self.extreme}")


def load_lm(spec: str):
    """``interp.load(spec)``, or for ``"tiny-gpt2"`` a random 2-layer GPT-2 (d 64) with a byte-level tokenizer."""
    import interp
    if spec == "tiny-gpt2":
        from interp.testing import tiny_model
        hf, tok = tiny_model("gpt2", n_layers=2)
        return interp.wrap(hf, tok, backend="torch")
    return interp.load(spec)


def _contexts(model, cfg: QDomainsConfig):
    texts = domain_corpora(cfg.max_chars)
    toks, dom = domain_contexts(model.tokenizer, texts, cfg.n_ctx + cfg.q_contexts, cfg.length)
    return list(texts), toks, dom


def harvest_domains(model, cfg: QDomainsConfig, folder: str | Path) -> None:
    """Step 1-2a: harvest the residual stream at ``blocks.{layer}.hook_resid_post`` of the ``n_ctx`` training
    contexts of every domain into an activation store in ``folder``."""
    from interp.store import harvest
    names, toks, _ = _contexts(model, cfg)
    train_toks = toks[: cfg.n_ctx * len(names)]
    harvest(model, train_toks, f"blocks.{cfg.layer}.hook_resid_post", folder, context_size=cfg.length + 1,
            batch_size=8, prepend_bos=True, separator=None, max_tokens=(cfg.length + 1) * len(train_toks))


def analyse_q_domains(model, cfg: QDomainsConfig, store_folder: str | Path) -> QDomainResult:
    """Steps 2b-4 on a store written by :func:`harvest_domains`: train the SAE, ``Q`` of ``n_features`` alive
    features, their domain preferences and the extreme-``Q`` groups (see the module docstring)."""
    from interp.dynamics.influence import q_proxy
    from interp.store import ActivationStore, train_sae

    layer, n_ctx, length, seed = cfg.layer, cfg.n_ctx, cfg.length, cfg.seed
    d_sae, k, sae_steps, n_features = cfg.d_sae, cfg.k, cfg.sae_steps, cfg.n_features
    q_length, q_position, extreme = cfg.q_length, cfg.q_position, cfg.extreme
    site = f"blocks.{layer}.hook_resid_post"
    names, toks, dom = _contexts(model, cfg)
    train_toks, train_dom = toks[: n_ctx * len(names)], dom[: n_ctx * len(names)]
    store = ActivationStore(store_folder)
    sae_res = train_sae(store, site, architecture="topk", d_sae=d_sae, k=k, steps=sae_steps, batch_size=256,
                        lr=3e-4, seed=seed)
    sae = sae_res.sae.eval()
    # per-row activations in store order = context order (each context is one domain's chunk, BOS first)
    rows = store.rows(slice(0, len(store)), site)[site].float()
    n_rows = rows.shape[0]
    if n_rows != len(train_toks) * (length + 1):
        raise RuntimeError(f"store has {n_rows} rows, expected {len(train_toks) * (length + 1)}")
    row_dom = np.repeat(train_dom, length + 1)
    not_bos = np.tile(np.arange(length + 1) > 0, len(train_toks))
    with torch.no_grad():
        acts = torch.cat([sae.encode(rows[i:i + 4096]) for i in range(0, n_rows, 4096)])[torch.from_numpy(not_bos)]
    row_dom = row_dom[not_bos]
    with torch.no_grad():
        fvu = float(((sae.decode(sae.encode(rows[:4096])) - rows[:4096]) ** 2).sum() / ((rows[:4096] - rows[:4096].mean(0)) ** 2).sum())
    freq = (acts > 0).float().mean(0)
    alive = torch.nonzero(freq > 1e-3).flatten()
    g = torch.Generator().manual_seed(seed)
    feats = alive[torch.randperm(alive.numel(), generator=g)[:n_features]].sort().values
    mass = torch.stack([acts[torch.from_numpy(row_dom == j)][:, feats].sum(0) for j in range(len(names))], 1)  # [n, D]
    tok_share = torch.tensor([(row_dom == j).mean() for j in range(len(names))], dtype=torch.float32)
    pref = (mass / mass.sum(1, keepdim=True).clamp_min(1e-12)) / tok_share
    # Q on held-out contexts (BOS + q_length-1 tokens), all domains
    held = toks[n_ctx * len(names):, : q_length - 1]
    bos = model.tokenizer.bos_token_id
    held = torch.cat([torch.full((held.shape[0], 1), bos, dtype=torch.long), held], 1)
    W_dec = sae.W_dec.detach()[feats]                                           # [n, d]
    q = q_proxy(model, held, site, q_position, W_dec).q
    order = q.argsort()
    m = max(1, int(round(extreme * len(feats))))
    groups = {"all": torch.arange(len(feats)), f"top {m} Q": order[-m:], f"bottom {m} Q": order[:m]}
    summary = []
    for gname, idx in groups.items():
        row = {"group": gname, "n": len(idx), "median_Q": float(q[idx].median())}
        for j, d in enumerate(names):
            row[f"pref_{d}"] = float(pref[idx, j].mean())
        row["code+legal share"] = float((mass[idx][:, [names.index(x) for x in ("code", "legal") if x in names]].sum(1)
                                         / mass[idx].sum(1).clamp_min(1e-12)).mean())
        summary.append(row)
    q_np, formal = q.numpy(), (pref[:, [names.index(x) for x in ("code", "legal") if x in names]].sum(1)).numpy()
    from scipy.stats import spearmanr
    rho = spearmanr(q_np, formal)
    stats = {"d_sae": d_sae, "k": k, "steps": sae_steps, "fvu": fvu, "alive": int(alive.numel()),
             "rows": int(n_rows), "spearman_Q_vs_formal_pref": float(rho.statistic), "spearman_p": float(rho.pvalue)}
    return QDomainResult(site=site, position=q_position, domains=names, features=feats, q=q, domain_pref=pref,
                         sae_stats=stats, summary=summary)


def run_q_domains(cfg: QDomainsConfig, folder: str | Path) -> QDomainResult:
    """The whole run on ``cfg.spec``; the activation store is written to ``folder`` (which must not exist yet)."""
    model = load_lm(cfg.spec)
    harvest_domains(model, cfg, folder)
    return analyse_q_domains(model, cfg, folder)


__all__ = ["DOMAINS", "QDomainsConfig", "QDomainResult", "analyse_q_domains", "domain_contexts", "domain_corpora",
           "harvest_domains", "load_lm", "run_q_domains"]
