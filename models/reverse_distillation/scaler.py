"""The reverse-distillation scalers: PCR with the Johnstone threshold, plain linear / ridge maps, residual
principal directions, the Matryoshka output ``[H_r, H_res]``, chains over several model sizes and the naive
PCA baseline; fitted scalers are saved as safetensors + JSON and applied to new embeddings.

Shapes: ``H_r`` ``[L, k_r]`` (smaller model, ``L`` residues), ``H_p`` ``[L, k_p]`` (larger model), ``k_p > k_r``.

All fitting runs in float64 on torch (exact SVDs; the official code uses ``fbpca`` with two power iterations or
sklearn's ``IncrementalPCA``, which approximate the same truncated SVD). The output's first ``k_r`` columns are
the input tensor itself, copied bit for bit.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch

from interp.io import atomic_dir, legacy_by_json, load_json, load_tensors, save_tensors_json

__all__ = [
    "REGRESSORS", "VARIANTS", "SCALER_KINDS", "ScalerConfig", "johnstone_threshold", "estimate_noise_variance",
    "LinearMap", "fit_linear_map", "fit_pcr", "ResidualPCA", "fit_residual_pca", "RDScaler", "NaiveScaler",
    "RDChain", "reconstruction_r2",
]

REGRESSORS = ("pcr", "linear", "ridge")
VARIANTS = ("accumulated", "code")
SCALER_KINDS = ("rd", "naive")


@dataclass
class ScalerConfig:
    """How each step of a chain is fitted.

    ``regressor``: ``"pcr"`` (paper default, Johnstone threshold), ``"linear"`` (OLS with intercept) or
    ``"ridge"`` (``ridge_alpha`` as sklearn's ``Ridge(alpha)``, intercept unpenalised).
    ``min_variance_explained``: PCR fallback when no eigenvalue passes the threshold (code default 0.95).
    ``sigma_sq``: fixed PCR noise variance (``None``: estimated as in the code).
    ``kind``: ``"rd"`` (reverse distillation) or ``"naive"`` (PCA of ``[H_r, H_p]``, code ``naiveScaler``).
    ``variant``: ``"accumulated"`` fits step ``i`` on the accumulated RD embedding it is later applied to
    (paper Algorithm 3, our default); ``"code"`` fits on the raw smaller-model embedding (``scripts/train.py``)
    but applies to the accumulated one (``RDESM.forward``), as the official code does.
    """

    regressor: str = "pcr"
    ridge_alpha: float = 1.0
    min_variance_explained: float = 0.95
    sigma_sq: float | None = None
    kind: str = "rd"
    variant: str = "accumulated"

    def __post_init__(self) -> None:
        if self.regressor not in REGRESSORS:
            raise ValueError(f"regressor must be one of {REGRESSORS}, got {self.regressor!r}")
        if not self.ridge_alpha > 0:
            raise ValueError(f"ridge_alpha must be > 0, got {self.ridge_alpha}")
        if not 0 < self.min_variance_explained <= 1:
            raise ValueError(f"min_variance_explained must lie in (0, 1], got {self.min_variance_explained}")
        if self.sigma_sq is not None and not self.sigma_sq > 0:
            raise ValueError(f"sigma_sq must be > 0 or None, got {self.sigma_sq}")
        if self.kind not in SCALER_KINDS:
            raise ValueError(f"kind must be one of {SCALER_KINDS}, got {self.kind!r}")
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")


def _check_pair(h_r: torch.Tensor, h_p: torch.Tensor | None = None) -> None:
    if not isinstance(h_r, torch.Tensor) or h_r.dim() != 2:
        raise ValueError(f"embeddings must be 2-D tensors [residues, width], got {getattr(h_r, 'shape', type(h_r))}")
    if not torch.isfinite(h_r).all():
        raise ValueError("embeddings contain NaN or infinite values")
    if h_p is not None:
        _check_pair(h_p)
        if h_p.shape[0] != h_r.shape[0]:
            raise ValueError(f"smaller and larger embeddings must have the same rows (residues), got "
                             f"{h_r.shape[0]} and {h_p.shape[0]}")


# ------------------------------------------------------------------------------------------ regression
def johnstone_threshold(n_samples: int, n_features: int, sigma_sq: float = 1.0) -> float:
    """Upper edge of the Marchenko-Pastur bulk, ``sigma^2 (1 + sqrt(p/n))^2`` (Johnstone 2001)."""
    if n_samples < 1 or n_features < 1:
        raise ValueError(f"n_samples and n_features must be >= 1, got {n_samples} and {n_features}")
    return float(sigma_sq) * (1.0 + math.sqrt(n_features / n_samples)) ** 2


def estimate_noise_variance(eigenvalues: torch.Tensor, n_samples: int, n_features: int) -> float:
    """Noise variance of PCR as in the code: the median of the eigenvalues whose ratio to the mean eigenvalue is
    below ``(1 + sqrt(p/n))^2``; if there is none, the median of the smallest ``max(1, p // 4)`` eigenvalues.

    ``eigenvalues``: ``[p]`` in descending order (``S^2 / (n - 1)``). The median of an even count is the mean of
    the two middle values (NumPy's convention, which the code uses).
    """
    ratio = (1.0 + math.sqrt(n_features / n_samples)) ** 2
    eig = eigenvalues.double()
    noise = eig[eig / eig.mean() < ratio]
    if noise.numel() == 0:
        noise = eig[-max(1, n_features // 4):]
    return float(noise.quantile(0.5))


@dataclass
class LinearMap:
    """An affine map ``x -> x @ weight + bias`` (``weight`` ``[k_in, k_out]``, ``bias`` ``[k_out]``), float64,
    with the PCR diagnostics when it came from :func:`fit_pcr`."""

    weight: torch.Tensor
    bias: torch.Tensor
    regressor: str
    n_components: int | None = None        # PCR: retained principal components of the input
    sigma_sq: float | None = None          # PCR: noise variance
    threshold: float | None = None         # PCR: Johnstone threshold on the eigenvalues
    eigenvalues: torch.Tensor | None = None  # PCR: [k_in] input eigenvalues S^2/(n-1)
    input_components: torch.Tensor | None = None  # PCR: [k_in, k_in] right singular vectors (columns)
    input_mean: torch.Tensor | None = None  # [k_in]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``[L, k_in]`` -> ``[L, k_out]`` (float64)."""
        if x.dim() != 2 or x.shape[1] != self.weight.shape[0]:
            raise ValueError(f"input must be [L, {self.weight.shape[0]}], got {tuple(x.shape)}")
        return x.double() @ self.weight + self.bias


def fit_linear_map(x: torch.Tensor, y: torch.Tensor, regressor: str = "linear", ridge_alpha: float = 1.0,
                   min_variance_explained: float = 0.95, sigma_sq: float | None = None) -> LinearMap:
    """Least-squares map from ``x`` ``[n, p]`` to ``y`` ``[n, q]`` with intercept.

    ``"linear"``: OLS (minimum-norm solution if ``x`` is rank deficient); ``"ridge"``: ``(X_c^T X_c + alpha I)^-1
    X_c^T Y_c`` (sklearn ``Ridge``); ``"pcr"``: :func:`fit_pcr`.
    """
    if regressor == "pcr":
        return fit_pcr(x, y, min_variance_explained=min_variance_explained, sigma_sq=sigma_sq)
    if regressor not in REGRESSORS:
        raise ValueError(f"regressor must be one of {REGRESSORS}, got {regressor!r}")
    _check_pair(x, y)
    x, y = x.double(), y.double()
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    if regressor == "linear":
        weight = torch.linalg.pinv(xc) @ yc
    else:
        gram = xc.T @ xc + ridge_alpha * torch.eye(x.shape[1], dtype=torch.float64)
        weight = torch.linalg.solve(gram, xc.T @ yc)
    return LinearMap(weight, my - mx @ weight, regressor, input_mean=mx)


def fit_pcr(x: torch.Tensor, y: torch.Tensor, min_variance_explained: float = 0.95,
            sigma_sq: float | None = None) -> LinearMap:
    """Principal-component regression with the Johnstone threshold (code ``PCRegressionWrapper``).

    Centre ``x`` ``[n, p]`` and ``y`` ``[n, q]``; SVD ``X_c = U S V^T``; eigenvalues ``S^2/(n-1)``; noise variance
    from :func:`estimate_noise_variance` (unless given); keep the PCs whose eigenvalue exceeds
    ``sigma^2 (1 + sqrt(p/n))^2``, or, if none does, the fewest PCs explaining ``min_variance_explained`` of the
    variance; OLS of ``Y_c`` on the retained PC scores (they are orthogonal, so the OLS solution is
    ``diag(1/S_k) U_k^T Y_c``). Returned as one affine map ``x -> (x - mean) V_k B + mean_y``.
    """
    _check_pair(x, y)
    n, p = x.shape
    if n < 2:
        raise ValueError(f"PCR needs at least 2 rows, got {n}")
    x, y = x.double(), y.double()
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    u, s, vt = torch.linalg.svd(xc, full_matrices=False)        # s: [min(n, p)]
    eig = torch.zeros(p, dtype=torch.float64)
    eig[: s.numel()] = s ** 2 / (n - 1)
    sig = estimate_noise_variance(eig, n, p) if sigma_sq is None else float(sigma_sq)
    thr = johnstone_threshold(n, p, sig)
    k = int((eig > thr).sum())
    if k < 1:
        cum = torch.cumsum(eig, 0) / eig.sum()
        k = int(torch.searchsorted(cum, torch.tensor([min_variance_explained], dtype=torch.float64))) + 1
        k = min(k, s.numel())
    s_k = s[:k]
    if (s_k <= 0).any():
        raise ValueError("PCR kept a principal component of zero variance; the input is degenerate")
    coef = (u[:, :k].T @ yc) / s_k[:, None]                         # [k, q]
    v = vt.T                                                         # [p, min(n,p)]
    weight = v[:, :k] @ coef
    return LinearMap(weight, my - mx @ weight, "pcr", n_components=k, sigma_sq=sig, threshold=thr,
                     eigenvalues=eig, input_components=v, input_mean=mx)


# ------------------------------------------------------------------------------------------ residual PCA
@dataclass
class ResidualPCA:
    """Top principal directions of a matrix: ``transform(r) = (r - mean) @ components`` (``components``
    ``[q, k]`` orthonormal columns); ``explained_variance`` ``[k]`` (``S^2/(n-1)``)."""

    mean: torch.Tensor
    components: torch.Tensor
    explained_variance: torch.Tensor

    def transform(self, r: torch.Tensor) -> torch.Tensor:
        if r.dim() != 2 or r.shape[1] != self.components.shape[0]:
            raise ValueError(f"input must be [L, {self.components.shape[0]}], got {tuple(r.shape)}")
        return (r.double() - self.mean) @ self.components


def fit_residual_pca(r: torch.Tensor, n_components: int) -> ResidualPCA:
    """Exact PCA of ``r`` ``[n, q]`` (mean-centred, as the code's fbpca / IncrementalPCA do).

    Sign convention (the code's randomized SVD leaves it arbitrary): each direction's largest-magnitude loading is
    positive, so refits give identical outputs. If ``n_components`` exceeds the rank, the extra directions
    complete an orthonormal basis and carry zero variance.
    """
    if not 1 <= n_components <= r.shape[1]:
        raise ValueError(f"n_components must lie in [1, {r.shape[1]}], got {n_components}")
    r = r.double()
    mean = r.mean(0)
    _, s, vt = torch.linalg.svd(r - mean, full_matrices=False)   # vt: [min(n, q), q]
    if n_components > vt.shape[0]:                                # fewer rows than directions: complete the basis
        q_full, _ = torch.linalg.qr(torch.cat([vt.T, torch.eye(r.shape[1], dtype=torch.float64)], 1))
        vt = torch.cat([vt, q_full[:, vt.shape[0]:].T], 0)
    comps = vt[:n_components].T.clone()                           # [q, k]
    idx = comps.abs().argmax(0)
    comps *= torch.sign(comps[idx, torch.arange(n_components)])[None, :]
    var = torch.zeros(n_components, dtype=torch.float64)
    m = min(n_components, s.numel())
    var[:m] = s[:m] ** 2 / max(r.shape[0] - 1, 1)
    return ResidualPCA(mean, comps, var)


# ------------------------------------------------------------------------------------------ one step
def _tensors_to_save(prefix: str, obj) -> dict[str, torch.Tensor]:
    out = {}
    for name, value in vars(obj).items():
        if isinstance(value, torch.Tensor):
            out[f"{prefix}{name}"] = value.contiguous()
    return out


@dataclass
class RDScaler:
    """One reverse-distillation step from width ``k_r`` to ``k_p``.

    ``transform(h_r, h_p) = [h_r, (h_p - f(h_r) - mean_R) V_res]`` ``[L, k_p]``: the first ``k_r`` columns are
    ``h_r`` itself; ``f`` is the fitted :class:`LinearMap`; ``V_res`` the top ``k_p - k_r`` principal directions of
    the training residual ``R = H_p - f(H_r)`` (:class:`ResidualPCA`).
    """

    regression: LinearMap
    pca: ResidualPCA

    @classmethod
    def fit(cls, h_r: torch.Tensor, h_p: torch.Tensor, config: ScalerConfig | None = None) -> "RDScaler":
        config = config or ScalerConfig()
        _check_pair(h_r, h_p)
        k_r, k_p = h_r.shape[1], h_p.shape[1]
        if k_p <= k_r:
            raise ValueError(f"the larger embedding must be wider than the smaller one, got {k_p} <= {k_r}")
        reg = fit_linear_map(h_r, h_p, config.regressor, config.ridge_alpha, config.min_variance_explained,
                             config.sigma_sq)
        return cls(reg, fit_residual_pca(h_p.double() - reg(h_r), k_p - k_r))

    @property
    def widths(self) -> tuple[int, int]:
        k_r = self.regression.weight.shape[0]
        return k_r, k_r + self.pca.components.shape[1]

    def residual(self, h_r: torch.Tensor, h_p: torch.Tensor) -> torch.Tensor:
        """``H_res`` ``[L, k_p - k_r]`` (float64)."""
        _check_pair(h_r, h_p)
        k_r, k_p = self.widths
        if h_r.shape[1] != k_r or h_p.shape[1] != k_p:
            raise ValueError(f"this scaler maps width {k_r} -> {k_p}, got {h_r.shape[1]} and {h_p.shape[1]}")
        return self.pca.transform(h_p.double() - self.regression(h_r))

    def transform(self, h_r: torch.Tensor, h_p: torch.Tensor) -> torch.Tensor:
        """``[H_r, H_res]`` ``[L, k_p]`` in ``h_r``'s dtype; the prefix is ``h_r`` bit for bit."""
        return torch.cat([h_r, self.residual(h_r, h_p).to(h_r.dtype)], dim=1)

    def state(self) -> tuple[dict[str, torch.Tensor], dict]:
        tensors = {**_tensors_to_save("regression.", self.regression), **_tensors_to_save("pca.", self.pca)}
        meta = {"kind": "rd", "regressor": self.regression.regressor, "n_components": self.regression.n_components,
                "sigma_sq": self.regression.sigma_sq, "threshold": self.regression.threshold,
                "widths": list(self.widths)}
        return tensors, meta

    @classmethod
    def from_state(cls, tensors: dict[str, torch.Tensor], meta: dict) -> "RDScaler":
        reg = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith("regression.")}
        pca = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith("pca.")}
        lin = LinearMap(regressor=meta["regressor"], n_components=meta["n_components"], sigma_sq=meta["sigma_sq"],
                        threshold=meta["threshold"], **reg)
        return cls(lin, ResidualPCA(**pca))


@dataclass
class NaiveScaler:
    """The naive baseline (code ``naiveScaler``): PCA of ``[H_r, H_p]`` down to ``k_p`` dimensions."""

    pca: ResidualPCA
    k_r: int

    @classmethod
    def fit(cls, h_r: torch.Tensor, h_p: torch.Tensor, config: ScalerConfig | None = None) -> "NaiveScaler":
        _check_pair(h_r, h_p)
        if h_p.shape[1] <= h_r.shape[1]:
            raise ValueError(f"the larger embedding must be wider than the smaller one, got {h_p.shape[1]} <= "
                             f"{h_r.shape[1]}")
        both = torch.cat([h_r.double(), h_p.double()], 1)
        return cls(fit_residual_pca(both, h_p.shape[1]), h_r.shape[1])

    @property
    def widths(self) -> tuple[int, int]:
        return self.k_r, self.pca.components.shape[1]

    def transform(self, h_r: torch.Tensor, h_p: torch.Tensor) -> torch.Tensor:
        """``[L, k_p]`` PCA scores of ``[h_r, h_p]`` in ``h_r``'s dtype (no Matryoshka prefix)."""
        _check_pair(h_r, h_p)
        k_r, k_p = self.widths
        if h_r.shape[1] != k_r or h_p.shape[1] != k_p:
            raise ValueError(f"this scaler maps width {k_r} -> {k_p}, got {h_r.shape[1]} and {h_p.shape[1]}")
        return self.pca.transform(torch.cat([h_r.double(), h_p.double()], 1)).to(h_r.dtype)

    def state(self) -> tuple[dict[str, torch.Tensor], dict]:
        return _tensors_to_save("pca.", self.pca), {"kind": "naive", "widths": list(self.widths)}

    @classmethod
    def from_state(cls, tensors: dict[str, torch.Tensor], meta: dict) -> "NaiveScaler":
        pca = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith("pca.")}
        return cls(ResidualPCA(**pca), int(meta["widths"][0]))


# ------------------------------------------------------------------------------------------ chains
#: an RDChain folder written before the writer had its own name (its manifest names the shared "interp")
_LEGACY_CHAIN = legacy_by_json("chain.json", ("chain.json", "scalers.safetensors"), "format",
                               "interp.reverse_distillation.RDChain")


@dataclass
class RDChain:
    """Scalers along a family of increasing widths ``k_0 < k_1 < ... < k_m`` (one scaler per step).

    Applying (both variants, as ``RDESM.forward``): ``E_0 = H_0``, ``E_i = scaler_i.transform(E_{i-1}, H_i)``.
    Fitting: ``variant="accumulated"`` fits ``scaler_i`` on ``(E_{i-1}, H_i)``; ``variant="code"`` on
    ``(H_{i-1}, H_i)`` (``scripts/train.py``), so from the second step on it is applied to an input it was not
    fitted on. With ``kind="rd"`` every ``E_i`` starts with ``E_{i-1}`` (Matryoshka nesting).
    """

    scalers: list
    widths: tuple[int, ...]
    config: ScalerConfig

    @classmethod
    def fit(cls, embeddings: Sequence[torch.Tensor], config: ScalerConfig | None = None) -> "RDChain":
        """``embeddings``: per-residue embeddings of the same residues by each model, ascending width."""
        config = config or ScalerConfig()
        embs = list(embeddings)
        if len(embs) < 2:
            raise ValueError(f"a chain needs embeddings from at least 2 models, got {len(embs)}")
        for h in embs:
            _check_pair(embs[0], h)
        widths = tuple(h.shape[1] for h in embs)
        if any(b <= a for a, b in zip(widths, widths[1:])):
            raise ValueError(f"model widths must increase strictly along the chain, got {widths}")
        step = RDScaler if config.kind == "rd" else NaiveScaler
        scalers, acc = [], embs[0]
        for prev, h in zip(embs, embs[1:]):
            scaler = step.fit(acc if config.variant == "accumulated" else prev, h, config)
            scalers.append(scaler)
            acc = scaler.transform(acc, h)
        return cls(scalers, widths, config)

    def transform(self, embeddings: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``[E_0, E_1, ..., E_m]``, each ``[L, k_i]`` (``E_0`` is ``H_0`` itself)."""
        embs = list(embeddings)
        if tuple(h.shape[1] if h.dim() == 2 else -1 for h in embs) != self.widths:
            raise ValueError(f"expected embeddings of widths {self.widths}, got "
                             f"{[tuple(h.shape) for h in embs]}")
        out = [embs[0]]
        for scaler, h in zip(self.scalers, embs[1:]):
            out.append(scaler.transform(out[-1], h))
        return out

    def save(self, path: str | Path) -> Path:
        """Folder with ``chain.json`` and ``scalers.safetensors`` (written atomically)."""
        tensors, steps = {}, []
        for i, scaler in enumerate(self.scalers):
            t, meta = scaler.state()
            tensors.update({f"step{i}.{k}": v for k, v in t.items()})
            steps.append(meta)
        meta = {"format": "interp.reverse_distillation.RDChain", "version": 1, "widths": list(self.widths),
                "config": asdict(self.config), "steps": steps}
        path = Path(path)
        with atomic_dir(path, writer="RDChain.save", former=("interp",), legacy=_LEGACY_CHAIN) as tmp:
            save_tensors_json(tmp, tensors, meta, tensor_file="scalers.safetensors", json_file="chain.json")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "RDChain":
        path = Path(path)
        meta = load_json(path / "chain.json", what="RDChain", required=("format", "widths", "config", "steps"))
        if meta.get("format") != "interp.reverse_distillation.RDChain":
            raise ValueError(f"{path}/chain.json is not an RDChain file (format {meta.get('format')!r})")
        tensors, _ = load_tensors(path / "scalers.safetensors", what="RDChain")
        scalers = []
        for i, step in enumerate(meta["steps"]):
            t = {k[len(f"step{i}."):]: v for k, v in tensors.items() if k.startswith(f"step{i}.")}
            scalers.append((RDScaler if step["kind"] == "rd" else NaiveScaler).from_state(t, step))
        return cls(scalers, tuple(meta["widths"]), ScalerConfig(**meta["config"]))


def reconstruction_r2(target: torch.Tensor, features: torch.Tensor) -> float:
    """R^2 (variance-weighted over columns) of the OLS reconstruction of ``target`` ``[n, q]`` from ``features``
    ``[n, k]`` with intercept, in float64."""
    fit = fit_linear_map(features, target, "linear")
    t = target.double()
    err = ((t - fit(features)) ** 2).sum()
    return float(1.0 - err / ((t - t.mean(0)) ** 2).sum())
