"""The Majority experiments of Rofin, Naghiyev & Hahn (ICLR 2026) at CPU scale: train a small GPT-2 on Majority
or conditioned Majority (standard, myopic, m-untied or both), probe the NTP-useless features on the final model and
re-run training with the gradient-component influence (digest section 6, validation recipe).

The method (gradient components, myopic attention, m-untied GPT-2, feature influence, Ridge probe) is
:mod:`interp.dynamics.influence` and :mod:`interp.dynamics.untied`; the tasks are :mod:`interp.dynamics.tasks`.
Moved here from ``interp.dynamics.influence`` (issue #31); the code of the runs is unchanged.
"""
from __future__ import annotations

import dataclasses

import torch

from interp.dynamics.influence import (FeatureInfluence, attention_implementation, bootstrap_ci,
                                       register_myopic_attention, ridge_probe, train_with_influence)
from interp.dynamics.tasks import conditioned_majority, majority
from interp.dynamics.untied import untie_gpt2
from interp.results import Result

VARIANTS = ("standard", "myopic", "untied", "myopic+untied")


@dataclasses.dataclass
class MajorityConfig:
    """The Majority validation at CPU scale (the paper: 2 layers, d=128, 4 heads, Adam 1e-3, batch 256,
    3000 steps, 10 seeds). ``probe_layer`` follows the code's convention (0 = embeddings, k = output of block
    k−1). Positions are sequence indices *with* the BOS at 0, as in the official code (its sampler also prepends
    ``<bos>``): inputs at 1..10, outputs at 11..20. Position 10 (the last input) predicts the first output, so
    ``is_majority`` is NTP-*useful* there: the NTP-useless input positions are 1..9 (the digest's probe positions
    5–9), and ``split = 10`` (the official ``split_index``) puts every position whose loss predicts an output
    (10..19) on the second network."""

    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    steps: int = 600
    batch: int = 64
    lr: float = 1e-3
    variant: str = "standard"           # "standard" | "myopic" | "untied" | "myopic+untied"
    task: str = "majority"              # "majority" (probe is_majority_*) | "conditioned_majority" (probe prev_is_0)
    split: int = 10     # m of m-untied training: the official split_index 10 (its sequences carry a BOS too)
    probe_layer: int = 2
    probe_positions: tuple[int, ...] = (5, 6, 7, 8, 9)      # the digest's input positions 5-9 (official indices)
    influence_layer: int = 1    # pre-cached influence is structurally zero at the last layer (no attention after)
    influence_positions: tuple[int, ...] = (8, 15)          # one input, one output position
    influence_steps: int = 200
    influence_probe_alpha: float = 1.0  # the official influence probe: sklearn Ridge(alpha=probe_alpha), default 1.0
    n_probe: int = 2048
    seed: int = 0

    def __post_init__(self):
        for f in ("n_layers", "d_model", "n_heads", "steps", "batch", "n_probe", "influence_steps"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"MajorityConfig.{f} must be a positive integer, got {v!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"MajorityConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.variant not in VARIANTS:
            raise ValueError(f"MajorityConfig.variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.task not in ("majority", "conditioned_majority"):
            raise ValueError(f"MajorityConfig.task must be 'majority' or 'conditioned_majority', got {self.task!r}")
        if isinstance(self.split, bool) or not isinstance(self.split, int) or not 1 <= self.split <= 20:
            raise ValueError(f"MajorityConfig.split must be an integer in 1..20, got {self.split!r}")
        for f in ("probe_layer", "influence_layer"):
            if not 1 <= getattr(self, f) <= self.n_layers:
                raise ValueError(f"MajorityConfig.{f} must be in 1..{self.n_layers}, got {getattr(self, f)}")
        if not (self.influence_probe_alpha > 0):
            raise ValueError(f"MajorityConfig.influence_probe_alpha must be positive, got {self.influence_probe_alpha}")
        if not (self.lr > 0):
            raise ValueError(f"MajorityConfig.lr must be positive, got {self.lr}")
        for p in tuple(self.probe_positions) + tuple(self.influence_positions):
            if not 1 <= p <= 19:
                raise ValueError(f"MajorityConfig positions must be in 1..19 (sequence of 21 with BOS), got {p}")


@dataclasses.dataclass
class MajorityResult(Result):
    """Probe accuracy of ``is_majority_*`` per position on θ*, final loss, and the influence re-run."""

    config: dict
    probe_accuracy: dict[int, float]
    final_loss: float
    output_accuracy: float
    influence: FeatureInfluence | None
    first_output_accuracy: float = float("nan")     # legal prediction of the first output token (official metric)

    kind = "majority"

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame([{"position": p, "probe_accuracy": a} for p, a in self.probe_accuracy.items()])

    def figure(self):
        import plotly.express as px
        return px.line(self.to_frame(), x="position", y="probe_accuracy", markers=True,
                       title=f"{self.config.get('task', 'majority')} probe accuracy ({self.config['variant']})")


def _gpt2(cfg: MajorityConfig, vocab: int):
    import transformers as T
    torch.manual_seed(cfg.seed)
    c = T.GPT2Config(n_layer=cfg.n_layers, n_embd=cfg.d_model, n_head=cfg.n_heads, vocab_size=vocab, n_positions=32,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    hf = T.GPT2LMHeadModel(c)
    hf.set_attn_implementation(register_myopic_attention() if "myopic" in cfg.variant else "eager")
    if "untied" in cfg.variant:
        untie_gpt2(hf, cfg.split, seed=cfg.seed + 1)      # network B: an independent initialisation
    return hf.train()


def run_majority(cfg: MajorityConfig, track_influence: bool = True) -> MajorityResult:
    """Train on Majority, fit ``is_majority`` probes on θ* at ``probe_layer`` (held-out accuracy, sklearn
    logistic regression per feature, averaged over features), then (optionally) re-run training from the
    same init and data order accumulating the influence of each gradient component on those probes."""
    import copy

    import interp
    from sklearn.linear_model import LogisticRegression

    from interp.progress import progress
    gen = majority if cfg.task == "majority" else conditioned_majority
    data = gen(cfg.steps * cfg.batch, seed=cfg.seed)
    hf = _gpt2(cfg, data.vocab_size)
    init = copy.deepcopy(hf.state_dict())
    opt = torch.optim.Adam(hf.parameters(), lr=cfg.lr)
    batches = data.tokens.view(cfg.steps, cfg.batch, -1)
    for ids in progress(batches, desc="majority train"):
        logits = hf(ids).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    hf.eval()
    model = interp.wrap(hf, backend="torch")
    site = f"blocks.{cfg.probe_layer - 1}.hook_resid_post"
    isite = f"blocks.{cfg.influence_layer - 1}.hook_resid_post"
    held = gen(2 * cfg.n_probe, seed=cfg.seed + 10_000)
    with torch.no_grad():
        logits, cache = model.run_with_cache(held.tokens, names=[site, isite])
    out_pos = list(held.output_positions)
    pred = logits[:, [p - 1 for p in out_pos]].argmax(-1)
    if cfg.task == "majority":      # legal next outputs: the running majority before each output
        table = held.features[:, [p - 1 for p in out_pos]]
    else:                           # conditioned majority: fixed by the inputs
        table = held.labels["legal"][:, None].expand(-1, len(out_pos), -1)
    legal = table.gather(-1, pred[..., None]).squeeze(-1)
    n_tr = cfg.n_probe

    def accuracy(s: str, p: int, features) -> float:
        X = cache[s][:, p].numpy()
        scores = []
        for f in features:
            y = held.features[:, p, f].numpy()
            if len(set(y[:n_tr])) < 2:
                scores.append(float((y[n_tr:] == y[0]).mean()))
                continue
            clf = LogisticRegression(max_iter=2000).fit(X[:n_tr], y[:n_tr])
            scores.append(float(clf.score(X[n_tr:], y[n_tr:])))
        return float(sum(scores) / len(scores))
    probed = range(held.features.shape[-1]) if cfg.task == "majority" else [0]     # prev_is_0 (official probe)
    acc = {p: accuracy(site, p, probed) for p in cfg.probe_positions}
    # the influence probe w: as the official code, one multi-output sklearn Ridge per (layer, position) on all
    # features (0/1 targets), w = coef_[feature 0]; fitted on the probe-training half of the held-out set
    ws = {p: ridge_probe(cache[isite][:n_tr, p], held.features[:n_tr, p], cfg.influence_probe_alpha)[0]
          for p in cfg.influence_positions} if track_influence else {}
    influence = None
    if track_influence:
        steps = min(cfg.influence_steps, cfg.steps)
        with torch.no_grad():
            targets = {}
            for p in cfg.influence_positions:
                _, c2 = model.run_with_cache(batches[:steps].reshape(-1, batches.shape[-1]), names=isite)
                targets[p] = (c2[isite][:, p] @ ws[p]).view(steps, cfg.batch)
        hf.load_state_dict(init)
        hf.train()
        probes = [(held.feature_names[0], isite, p, ws[p], targets[p]) for p in cfg.influence_positions]
        influence = train_with_influence(model, dict(hf.named_parameters()), batches[:steps], probes, lr=cfg.lr,
                                         risk_context=(lambda: attention_implementation(hf, "eager"))
                                         if "myopic" in cfg.variant else None)
    return MajorityResult(config=dataclasses.asdict(cfg), probe_accuracy=acc, final_loss=float(loss.detach()),
                          output_accuracy=float(legal.float().mean()), influence=influence,
                          first_output_accuracy=float(legal[:, 0].float().mean()))


def majority_record(cfg: MajorityConfig, track_influence: bool, curve_every: int = 10) -> dict:
    """One Majority run as a JSON-able record: probe accuracies per position, legal-output and first-output
    accuracies, final loss and, with ``track_influence``, the cumulative influence rows of both optimisers plus the
    running sums every ``curve_every`` steps. (The recipe stores it as a stage; no cache here.)"""
    r = run_majority(cfg, track_influence=track_influence)
    rec = {"config": dataclasses.asdict(cfg), "track_influence": bool(track_influence),
           "probe_accuracy": {str(p): a for p, a in r.probe_accuracy.items()},
           "output_accuracy": r.output_accuracy, "first_output_accuracy": r.first_output_accuracy,
           "final_loss": r.final_loss, "influence": None, "curves": None}
    if r.influence is not None:
        fi = r.influence
        rec["influence"] = fi.to_frame().to_dict(orient="records")
        n = fi.curves["adam"]["direct"].shape[0]
        keep = sorted(set(range(curve_every - 1, n, curve_every)) | {n - 1})
        rec["curves"] = {"steps": [k + 1 for k in keep], "probes": [list(x) for x in fi.probes],
                         **{f"{o}/{c}": fi.curves[o][c][keep].tolist() for o in fi.curves for c in fi.curves[o]},
                         **{f"centered/{o}/{c}": fi.curves_centered[o][c][keep].tolist()
                            for o in fi.curves_centered for c in fi.curves_centered[o]}}
    return rec


def mean_probe_accuracy(rec: dict) -> float:
    """A record's probe accuracy averaged over its probe positions."""
    return sum(rec["probe_accuracy"].values()) / len(rec["probe_accuracy"])


def influence_summary(records: list[dict], n_boot: int = 10_000, optimizer: str = "adam") -> list[dict]:
    """Cumulative influence per component and position over seeds (one record with influence per seed): rows
    ``quantity, mean, lo, hi`` (95 % percentile bootstrap CI of the mean over seeds), for the official risk
    (``influence_*``) and the centred diagnostic (``centered_influence_*``), plus ``precached+shared`` per position."""
    import pandas as pd
    frames = [pd.DataFrame(r["influence"]) for r in records]
    df = pd.concat([f[f.optimizer == optimizer].assign(seed=k) for k, f in enumerate(frames)])
    rows = []
    for col, tag in (("influence", "influence"), ("influence_centered", "centered_influence")):
        if col not in df or df[col].isna().any():
            continue
        for (c, p), g in df.groupby(["component", "position"]):
            m, lo, hi = bootstrap_ci(g[col].values, n_boot=n_boot)
            rows.append({"quantity": f"{tag}_{c}@{p}", "mean": m, "lo": lo, "hi": hi})
        both = df[df.component.isin(["precached", "shared"])].groupby(["position", "seed"])[col].sum()
        for p in sorted(set(df.position)):
            m, lo, hi = bootstrap_ci(both.loc[p].values, n_boot=n_boot)
            rows.append({"quantity": f"{tag}_precached+shared@{p}", "mean": m, "lo": lo, "hi": hi})
    return rows


__all__ = ["VARIANTS", "MajorityConfig", "MajorityResult", "FeatureInfluence", "run_majority", "majority_record",
           "mean_probe_accuracy", "influence_summary"]
