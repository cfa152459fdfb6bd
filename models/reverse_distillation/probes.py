"""Few-shot ridge probes and the exactness diagnostics of reverse distillation."""
from __future__ import annotations

import numpy as np
import torch

from .scaler import RDScaler, reconstruction_r2

__all__ = ["ALPHAS", "probe_score", "exactness"]

#: ridge penalties searched by leave-one-out (generalised) cross-validation on the labelled examples
ALPHAS = np.logspace(-3, 4, 15)


def probe_score(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                kind: str = "regression") -> np.ndarray | float:
    """Fit ridge probes (features standardised on the labelled examples, ``RidgeCV`` over :data:`ALPHAS` by
    generalised cross-validation, one penalty per target) on ``x_train`` ``[n, d]`` / ``y_train`` ``[n]`` or
    ``[n, T]`` and score them on the test set: Spearman correlation for ``kind="regression"``, AUROC of the ridge
    output for ``kind="binary"``. Returns a float (1-D ``y``) or ``[T]`` scores; NaN where labels are constant.
    """
    from scipy.stats import rankdata
    from sklearn.linear_model import RidgeCV
    from sklearn.metrics import roc_auc_score

    if kind not in ("regression", "binary"):
        raise ValueError(f"kind must be 'regression' or 'binary', got {kind!r}")
    x_train, x_test = np.asarray(x_train, dtype=np.float64), np.asarray(x_test, dtype=np.float64)
    if x_train.ndim != 2 or x_test.ndim != 2 or x_train.shape[1] != x_test.shape[1]:
        raise ValueError(f"features must be [n, d] with equal d, got {x_train.shape} and {x_test.shape}")
    y_train, y_test = np.asarray(y_train, dtype=np.float64), np.asarray(y_test, dtype=np.float64)
    single = y_train.ndim == 1
    y_train, y_test = y_train.reshape(len(y_train), -1), y_test.reshape(len(y_test), -1)
    if len(y_train) != len(x_train) or len(y_test) != len(x_test) or y_train.shape[1] != y_test.shape[1]:
        raise ValueError("features and labels must have matching rows, train and test the same targets")
    mu, sd = x_train.mean(0), x_train.std(0)
    sd[sd < 1e-12] = 1.0
    ok = (np.ptp(y_train, 0) > 0) & (np.ptp(y_test, 0) > 0)
    out = np.full(y_train.shape[1], np.nan)
    if ok.any():
        model = RidgeCV(alphas=ALPHAS, alpha_per_target=bool(ok.sum() > 1)).fit((x_train - mu) / sd, y_train[:, ok])
        pred = model.predict((x_test - mu) / sd).reshape(len(x_test), -1)
        cols = np.flatnonzero(ok)
        if kind == "binary":
            out[cols] = [roc_auc_score(y_test[:, j], pred[:, i]) for i, j in enumerate(cols)]
        else:
            rp, ry = rankdata(pred, axis=0), rankdata(y_test[:, cols], axis=0)
            rp, ry = rp - rp.mean(0), ry - ry.mean(0)
            den = np.sqrt((rp ** 2).sum(0) * (ry ** 2).sum(0))
            out[cols] = np.where(den > 0, (rp * ry).sum(0) / np.where(den > 0, den, 1), 0.0)
    return float(out[0]) if single else out


def exactness(scaler: RDScaler, h_r: torch.Tensor, h_p: torch.Tensor, n_random: int = 20, seed: int = 0) -> dict:
    """The digest's exactness criteria of one fitted step on its fit data.

    * ``prefix_exact``: the first ``k_r`` output columns equal ``h_r`` bit for bit;
    * ``max_abs_corr_input``: ``max |corr(H_res_j, H_r_i)|`` (zero for OLS);
    * ``max_abs_corr_retained``: ``max |corr(H_res_j, PC score_i)|`` over the retained input PCs (zero for PCR;
      equals the input correlation check for OLS, where every PC is retained);
    * ``r2_rd``: R^2 of the OLS reconstruction of ``h_p`` from ``[h_r, H_res]``;
    * ``r2_random``: the same from ``[h_r, X]`` for ``n_random`` random ``k``-dimensional complements ``X`` (random
      orthonormal projections of the residual ``h_p - f(h_r)``, the strongest random competitors since they carry
      only what ``h_r`` does not); ``beats_random``: ``r2_rd >= max(r2_random)``.
    """
    out = scaler.transform(h_r, h_p)
    k_r, k_p = scaler.widths
    res = out[:, k_r:].double()
    hr = h_r.double()

    def max_corr(a: torch.Tensor, b: torch.Tensor) -> float:
        a = (a - a.mean(0)) / a.std(0).clamp_min(1e-300)
        b = (b - b.mean(0)) / b.std(0).clamp_min(1e-300)
        return float(((a.T @ b) / (a.shape[0] - 1)).abs().max())

    reg = scaler.regression
    if reg.regressor == "pcr":
        scores = (hr - reg.input_mean) @ reg.input_components[:, : reg.n_components]
    else:
        scores = hr
    resid = h_p.double() - reg(h_r)
    g = torch.Generator().manual_seed(seed)
    r2_random = []
    for _ in range(n_random):
        q, _ = torch.linalg.qr(torch.randn(k_p, k_p - k_r, generator=g, dtype=torch.float64))
        r2_random.append(reconstruction_r2(h_p, torch.cat([hr, resid @ q], 1)))
    r2_rd = reconstruction_r2(h_p, torch.cat([hr, res], 1))
    return {"prefix_exact": bool(torch.equal(out[:, :k_r], h_r)), "max_abs_corr_input": max_corr(res, hr),
            "max_abs_corr_retained": max_corr(res, scores), "r2_rd": r2_rd, "r2_random_max": max(r2_random),
            "r2_random_mean": float(np.mean(r2_random)), "beats_random": bool(r2_rd >= max(r2_random) - 1e-12),
            "n_components": reg.n_components}
