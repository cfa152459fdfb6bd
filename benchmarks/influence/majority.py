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
                                       register_myopic_attention, ridge_pearson, ridge_probe, train_with_influence)
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
    (10..19) on the second network.

    Probe metric (issue #33): the official one, Pearson's r of a ``Ridge(probe_alpha)`` probe per feature on the
    held-out split, averaged over the features (``probe_pearson``); our earlier held-out logistic-regression accuracy
    stays as a second column (``probe_accuracy``). Influence coverage (issue #33): as the official Majority sweep,
    every training step (``influence_steps=None``; an integer tracks only the first steps, a subsample that a preset
    must say it is), positions 2–19, layers 1 and 2 and every feature (``influence_features=None``); the risk is the
    official MSE (``influence_risk_scale=1``; 0.5 = the ½·MSE used before #33, every influence half the official
    one). ``influence_centered``: also accumulate our centred-risk diagnostic (one more backward per probe)."""

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
    influence_layers: tuple[int, ...] = (1, 2)              # the official sweep's layer indices
    influence_positions: tuple[int, ...] = tuple(range(2, 20))   # the official sweep's sequence indices 2-19
    influence_features: tuple[int, ...] | None = None       # None: every feature (the official three is_majority_*)
    influence_steps: int | None = None                      # None: every training step (official)
    influence_risk_scale: float = 1.0                       # official mse_loss; 0.5 = the former ½·MSE
    influence_centered: bool = True                         # our centred-risk diagnostic
    probe_alpha: float = 1.0    # the official probes: sklearn Ridge(alpha=probe_alpha), probe_alpha = 1.0
    n_probe: int = 2048
    seed: int = 0

    def __post_init__(self):
        for f in ("n_layers", "d_model", "n_heads", "steps", "batch", "n_probe") + (
                ("influence_steps",) if self.influence_steps is not None else ()):
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
        if not 1 <= self.probe_layer <= self.n_layers:
            raise ValueError(f"MajorityConfig.probe_layer must be in 1..{self.n_layers}, got {self.probe_layer}")
        if not self.influence_layers or not all(1 <= x <= self.n_layers for x in self.influence_layers):
            raise ValueError(f"MajorityConfig.influence_layers must be a non-empty tuple in 1..{self.n_layers}, "
                             f"got {self.influence_layers}")
        if not self.influence_positions:
            raise ValueError("MajorityConfig.influence_positions is empty")
        if self.influence_features is not None and (not self.influence_features
                                                    or not all(0 <= f < 3 for f in self.influence_features)):
            raise ValueError(f"MajorityConfig.influence_features must be None (all) or indices in 0..2, "
                             f"got {self.influence_features}")
        if not (self.probe_alpha > 0):
            raise ValueError(f"MajorityConfig.probe_alpha must be positive, got {self.probe_alpha}")
        if not (self.influence_risk_scale > 0):
            raise ValueError(f"MajorityConfig.influence_risk_scale must be positive, got {self.influence_risk_scale}")
        if not (self.lr > 0):
            raise ValueError(f"MajorityConfig.lr must be positive, got {self.lr}")
        for p in tuple(self.probe_positions) + tuple(self.influence_positions):
            if not 1 <= p <= 19:
                raise ValueError(f"MajorityConfig positions must be in 1..19 (sequence of 21 with BOS), got {p}")


@dataclasses.dataclass
class MajorityResult(Result):
    """Probe quality of the probed feature(s) per position on θ*: ``probe_pearson`` (official: Ridge(α) Pearson r,
    mean over features) and ``probe_accuracy`` (ours: logistic-regression accuracy); final loss; the influence
    re-run."""

    config: dict
    probe_accuracy: dict[int, float]
    final_loss: float
    output_accuracy: float
    influence: FeatureInfluence | None
    first_output_accuracy: float = float("nan")     # legal prediction of the first output token (official metric)
    probe_pearson: dict[int, float] = dataclasses.field(default_factory=dict)

    kind = "majority"

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame([{"position": p, "probe_pearson": self.probe_pearson.get(p, float("nan")),
                              "probe_accuracy": a} for p, a in self.probe_accuracy.items()])

    def figure(self):
        import plotly.express as px
        return px.line(self.to_frame(), x="position", y="probe_pearson", markers=True,
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
    """Train on Majority, probe ``is_majority`` on θ* at ``probe_layer`` (official: Pearson r of a Ridge probe per
    feature, averaged over features; ours as a second column: held-out logistic-regression accuracy), then
    (optionally) re-run training from the same init and data order accumulating the influence of each gradient
    component on the official influence probes (Ridge per layer and position, ``w = coef_[feature]``) at every
    ``influence_layers`` x ``influence_positions`` x feature."""
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
    held = gen(2 * cfg.n_probe, seed=cfg.seed + 10_000)
    with torch.no_grad():
        logits, cache = model.run_with_cache(held.tokens, names=[site])
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
    probed = list(range(held.features.shape[-1])) if cfg.task == "majority" else [0]   # prev_is_0 (official)
    acc = {p: accuracy(site, p, probed) for p in cfg.probe_positions}
    # the official metric: Ridge(probe_alpha) on the probe-training half, Pearson r on the other half, mean over
    # features (all positions in one batched solve)
    pp = list(cfg.probe_positions)
    Xp = cache[site][:, pp].transpose(0, 1)                                    # [P, n, d]
    Yp = held.features[:, pp][..., probed].transpose(0, 1)                    # [P, n, F]
    r = ridge_pearson(Xp[:, :n_tr], Yp[:, :n_tr], Xp[:, n_tr:], Yp[:, n_tr:], cfg.probe_alpha)   # [P, F]
    pearson = {p: float(r[k].nanmean()) for k, p in enumerate(pp)}
    influence = None
    if track_influence:
        steps = cfg.steps if cfg.influence_steps is None else min(cfg.influence_steps, cfg.steps)
        isites = [f"blocks.{layer - 1}.hook_resid_post" for layer in cfg.influence_layers]
        ipos = list(cfg.influence_positions)
        feats = list(range(held.features.shape[-1])) if cfg.influence_features is None else list(cfg.influence_features)
        with torch.no_grad():
            _, c1 = model.run_with_cache(held.tokens[:n_tr], names=isites)
            # the official influence probes: one multi-output Ridge per (layer, position) on all features,
            # w = coef_[feature]; fitted on the probe-training half of the held-out set (batched over positions)
            W = {s: ridge_probe(c1[s][:, ipos].transpose(0, 1), held.features[:n_tr, ipos].transpose(0, 1),
                                cfg.probe_alpha) for s in isites}                   # [P, F_all, d]
            # θ*'s projections on every training batch: the targets <w, r_θ*> [probe, step, batch]
            flat = batches[:steps].reshape(-1, batches.shape[-1])
            proj = {s: [] for s in isites}
            for lo in range(0, flat.shape[0], 4096):
                _, c2 = model.run_with_cache(flat[lo:lo + 4096], names=isites)
                for s in isites:
                    proj[s].append(torch.einsum("npd,pfd->npf", c2[s][:, ipos].float(), W[s]))
            proj = {s: torch.cat(v).view(steps, cfg.batch, len(ipos), -1) for s, v in proj.items()}
        hf.load_state_dict(init)
        hf.train()
        probes = [(held.feature_names[f], s, p, W[s][k, f], proj[s][:, :, k, f])
                  for s in isites for k, p in enumerate(ipos) for f in feats]
        influence = train_with_influence(model, dict(hf.named_parameters()), batches[:steps], probes, lr=cfg.lr,
                                         risk_context=(lambda: attention_implementation(hf, "eager"))
                                         if "myopic" in cfg.variant else None,
                                         risk_scale=cfg.influence_risk_scale, centered=cfg.influence_centered)
    return MajorityResult(config=dataclasses.asdict(cfg), probe_accuracy=acc, final_loss=float(loss.detach()),
                          output_accuracy=float(legal.float().mean()), influence=influence,
                          first_output_accuracy=float(legal[:, 0].float().mean()), probe_pearson=pearson)


def majority_record(cfg: MajorityConfig, track_influence: bool, curve_every: int = 10) -> dict:
    """One Majority run as a JSON-able record: probe quality per position (``probe_pearson``, official;
    ``probe_accuracy``, ours), legal-output and first-output accuracies, final loss and, with ``track_influence``,
    the cumulative influence rows of both optimisers plus the running sums every ``curve_every`` steps. (The recipe
    stores it as a stage; no cache here.)"""
    r = run_majority(cfg, track_influence=track_influence)
    rec = {"config": dataclasses.asdict(cfg), "track_influence": bool(track_influence),
           "probe_pearson": {str(p): a for p, a in r.probe_pearson.items()},
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
                         **({f"centered/{o}/{c}": fi.curves_centered[o][c][keep].tolist()
                             for o in fi.curves_centered for c in fi.curves_centered[o]}
                            if fi.curves_centered is not None else {})}
    return rec


def mean_probe_accuracy(rec: dict) -> float:
    """A record's logistic probe accuracy (ours) averaged over its probe positions."""
    return sum(rec["probe_accuracy"].values()) / len(rec["probe_accuracy"])


def mean_probe_pearson(rec: dict) -> float:
    """A record's official probe metric (Ridge Pearson r, mean over features) averaged over its probe positions."""
    return sum(rec["probe_pearson"].values()) / len(rec["probe_pearson"])


def influence_summary(records: list[dict], n_boot: int = 10_000, optimizer: str = "adam") -> list[dict]:
    """Cumulative influence per (feature, site, position, component) over seeds (one record with influence per
    seed): rows ``quantity, feature, site, position, component, mean, lo, hi`` (95 % percentile bootstrap CI of the
    mean over seeds), for the official risk (``quantity = "influence"``) and the centred diagnostic
    (``"centered_influence"``, when recorded), plus ``precached+shared`` summed per seed before the CI."""
    import pandas as pd
    frames = [pd.DataFrame(r["influence"]) for r in records]
    df = pd.concat([f[f.optimizer == optimizer].assign(seed=k) for k, f in enumerate(frames)])
    keys = ["feature", "site", "position"]
    rows = []
    for col, tag in (("influence", "influence"), ("influence_centered", "centered_influence")):
        if col not in df or df[col].isna().any():
            continue
        both = df[df.component.isin(["precached", "shared"])].groupby(keys + ["seed"], sort=False)[col].sum()
        both = both.reset_index().assign(component="precached+shared")
        for (f, s, p, c), g in pd.concat([df, both]).groupby(keys + ["component"], sort=False):
            m, lo, hi = bootstrap_ci(g.sort_values("seed")[col].values, n_boot=n_boot)
            rows.append({"quantity": tag, "feature": f, "site": s, "position": int(p), "component": c,
                         "mean": m, "lo": lo, "hi": hi})
    return rows


def summary_row(rows: list[dict], component: str, position: int, site: str, feature: str,
                quantity: str = "influence") -> dict:
    """The row of :func:`influence_summary` for one probe and component (a clear error when it is missing)."""
    hit = [r for r in rows if r["quantity"] == quantity and r["component"] == component and r["position"] == position
           and r["site"] == site and r["feature"] == feature]
    if len(hit) != 1:
        raise KeyError(f"no single {quantity} row for {component} at {site} position {position} feature {feature}")
    return hit[0]


__all__ = ["VARIANTS", "MajorityConfig", "MajorityResult", "FeatureInfluence", "run_majority", "majority_record",
           "mean_probe_accuracy", "mean_probe_pearson", "influence_summary", "summary_row"]
