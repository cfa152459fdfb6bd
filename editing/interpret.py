"""Interpretability of an edit: the top-activating tokens (from real text) of every feature an edit changed."""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Sequence

import torch

from interp.io import atomic_write_text
from interp.results import Result

from .transcoders import Transcoder, splice


@dataclass
class FeatureTokens(Result):
    """``examples[f]``: the ``k`` strongest (activation, token, context) of feature ``f`` on the given text."""

    kind = "feature_tokens"
    features: list[int]
    examples: dict = field(default_factory=dict)

    def to_frame(self):
        import pandas as pd
        rows = [{"feature": f, "rank": i, "activation": a, "token": t, "context": c}
                for f in self.features for i, (a, t, c) in enumerate(self.examples[str(f)])]
        return pd.DataFrame(rows, columns=["feature", "rank", "activation", "token", "context"])

    def figure(self):
        import plotly.graph_objects as go
        top = [self.examples[str(f)][0][0] if self.examples[str(f)] else 0.0 for f in self.features]
        return go.Figure(go.Bar(x=[str(f) for f in self.features], y=top)).update_layout(
            title="max activation of each edited feature", xaxis_title="feature")

    def to_html(self) -> str:
        """A self-contained HTML table: one row per feature, its top tokens with their contexts."""
        rows = []
        for f in self.features:
            cells = " ".join(f"<span title='{html.escape(c)}' style='background:rgba(255,120,0,{min(1.0, a / max(1e-9, self.examples[str(f)][0][0])):.2f})'>"
                             f"{html.escape(t)}</span> <small>{a:.2f}</small>" for a, t, c in self.examples[str(f)])
            rows.append(f"<tr><td>{f}</td><td>{cells}</td></tr>")
        return ("<table><tr><th>feature</th><th>top-activating tokens (hover: context)</th></tr>"
                + "".join(rows) + "</table>")

    def save_html(self, path) -> None:
        atomic_write_text(path, "<html><meta charset='utf-8'><body>" + self.to_html() + "</body></html>")


@torch.no_grad()
def feature_top_tokens(model, layer: int, transcoder: Transcoder, features: Sequence[int], texts: Sequence[str],
                       k: int = 10, context: int = 6, batch_size: int = 16, max_length: int | None = 128) -> FeatureTokens:
    """The ``k`` real-text tokens on which each of ``features`` fires most (with ``context`` tokens before)."""
    feats = torch.as_tensor(list(features), dtype=torch.long)
    if feats.numel() == 0:
        raise ValueError("features is empty")
    if int(feats.min()) < 0 or int(feats.max()) >= transcoder.d_sae:
        raise ValueError(f"feature ids must be in 0..{transcoder.d_sae - 1}")
    best_a = torch.full((len(feats), k), -1.0)
    best_loc: list[list[tuple[int, int]]] = [[(-1, -1)] * k for _ in feats]
    all_ids: list[torch.Tensor] = []
    with splice(model, layer, transcoder) as s:
        for i in range(0, len(texts), batch_size):
            batch = model.tokenize(list(texts[i:i + batch_size]), max_length=max_length)
            _, cache = model.run_with_cache(batch, names=[s.features], stop_at_layer=layer + 1)
            z = cache[s.features][..., feats].float().cpu()  # [b, pos, F]
            z = z.masked_fill(~batch["attention_mask"].bool()[..., None], -1.0)
            b, p = z.shape[:2]
            flat = z.reshape(b * p, len(feats)).T  # [F, b*pos]
            top = flat.topk(min(k, flat.shape[1]), dim=1)
            cand_a = torch.cat([best_a, top.values], 1)
            order = cand_a.topk(k, dim=1).indices
            for fi in range(len(feats)):
                locs = best_loc[fi] + [(len(all_ids) + int(j) // p, int(j) % p) for j in top.indices[fi]]
                best_loc[fi] = [locs[int(o)] for o in order[fi]]
            best_a = cand_a.gather(1, order)
            all_ids.extend(batch["input_ids"])
    ex = {}
    for fi, f in enumerate(feats.tolist()):
        rows = []
        for a, (r, q) in zip(best_a[fi].tolist(), best_loc[fi]):
            if r < 0 or a <= 0:
                continue
            ids = all_ids[r]
            rows.append((a, model.to_string(ids[q:q + 1].tolist()), model.to_string(ids[max(0, q - context):q + 1].tolist())))
        ex[str(f)] = rows
    return FeatureTokens(features=feats.tolist(), examples=ex)


__all__ = ["FeatureTokens", "feature_top_tokens"]
