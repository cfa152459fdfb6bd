"""Views researchers reach for in a notebook, offline: attention patterns and token-coloured text.

* :func:`attention_view` — a plotly heatmap of the attention pattern of any heads on one prompt, the prompt's
  tokens on both axes (query down, key across) and a drop-down to switch heads; works from a model and a
  prompt or from a cache that holds ``blocks.{l}.attn.hook_pattern``.
* :func:`token_view` — the prompt's tokens as text, each on a background coloured by a value (a logit
  difference, an activation, an attribution): a :class:`TokenView` whose ``_repr_html_`` renders in Jupyter
  and whose ``.html`` goes into any HTML report. No JavaScript, no network.
"""
from __future__ import annotations

import html as _html
from dataclasses import dataclass
from typing import Any, Sequence

import torch

Head = tuple[int, int]


def _heads(heads: Sequence[Head] | Head | None, n_layers: int, n_heads: int) -> list[Head]:
    if heads is None:
        return [(l, h) for l in range(n_layers) for h in range(n_heads)]
    if isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(x, int) for x in heads):
        heads = [heads]
    out = []
    for item in heads:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise TypeError(f"heads are (layer, head) pairs, got {item!r}")
        l, h = (int(x) for x in item)
        if not (-n_layers <= l < n_layers and -n_heads <= h < n_heads):
            raise ValueError(f"head {item!r} is out of range: the model has {n_layers} layers x {n_heads} heads")
        out.append((l % n_layers, h % n_heads))
    return out


def attention_view(source: Any, prompt: str | None = None, heads: Sequence[Head] | Head | None = None,
                   tokens: Sequence[str] | None = None, batch: int = 0, title: str | None = None):
    """Attention patterns of ``heads`` (``(layer, head)`` pairs; default: every head) as a plotly figure.

    ``source`` is an :class:`interp.Model` (``prompt`` required: it is run once and its patterns captured), an
    :class:`interp.Cache` holding the patterns (``tokens`` then labels the axes; ``batch`` picks the row), or the
    patterns themselves, a tensor ``[n_heads, query, key]`` with ``heads`` naming its rows in order (for patterns
    kept in a saved result). One heatmap per head, shown one at a time through a drop-down. Negative layers and
    heads count from the end.
    """
    from .cache import Cache

    if isinstance(source, torch.Tensor):
        if source.ndim != 3 or source.shape[-1] != source.shape[-2]:
            raise ValueError(f"patterns must be [n_heads, query, key] with query == key, got {tuple(source.shape)}")
        if heads is None or len(heads) != source.shape[0]:
            raise ValueError(f"give heads: one (layer, head) pair per pattern ({source.shape[0]} patterns)")
        chosen = [(int(l), int(h)) for l, h in heads]
        return _pattern_figure(chosen, list(source.float().cpu()), tokens, title)
    if isinstance(source, Cache):
        cache = source
        if prompt is not None and tokens is None and cache.model is not None:
            tokens = cache.model.to_str_tokens(prompt)
    else:
        if prompt is None:
            raise ValueError("attention_view(model, prompt): give the prompt to run")
        _, cache = source.run_with_cache(prompt, names="blocks.*.attn.hook_pattern")
        tokens = source.to_str_tokens(prompt) if tokens is None else tokens
    patterns = sorted((n for n in cache if n.endswith("attn.hook_pattern")), key=lambda n: int(n.split(".")[1]))
    if not patterns:
        raise ValueError("the cache holds no attention patterns (capture 'blocks.*.attn.hook_pattern')")
    n_layers = int(patterns[-1].split(".")[1]) + 1
    first = cache[patterns[0]]  # [batch, head, q, k]
    chosen = _heads(heads, n_layers, first.shape[1])
    mats = []
    for l, h in chosen:
        name = f"blocks.{l}.attn.hook_pattern"
        if name not in cache:
            raise ValueError(f"the cache has no pattern for layer {l} ({name})")
        mats.append(cache[name][batch, h].float().cpu())
    return _pattern_figure(chosen, mats, tokens, title)


def _pattern_figure(chosen: list[Head], mats: list[torch.Tensor], tokens: Sequence[str] | None, title: str | None):
    """One heatmap per ``(layer, head)`` of ``chosen`` (``mats``: ``[query, key]`` each) and the head drop-down."""
    import plotly.graph_objects as go

    n = mats[0].shape[-1]
    labels = [f"{i}: {t}" for i, t in enumerate(tokens)] if tokens is not None else [str(i) for i in range(n)]
    if len(labels) != n:
        raise ValueError(f"{len(labels)} tokens given for a pattern over {n} positions")
    fig = go.Figure()
    for i, ((l, h), m) in enumerate(zip(chosen, mats)):
        fig.add_trace(go.Heatmap(z=m.numpy(), x=labels, y=labels, zmin=0.0, zmax=1.0, colorscale="Blues",
                                 visible=i == 0, name=f"L{l}H{h}",
                                 hovertemplate="query %{y}<br>key %{x}<br>attention %{z:.3f}<extra>L%{meta}</extra>",
                                 meta=f"{l}H{h}"))
    buttons = [dict(label=f"L{l}H{h}", method="update",
                    args=[{"visible": [j == i for j in range(len(chosen))]},
                          {"title.text": f"{title or 'attention pattern'}: layer {l}, head {h}"}])
               for i, (l, h) in enumerate(chosen)]
    l0, h0 = chosen[0]
    fig.update_layout(title=f"{title or 'attention pattern'}: layer {l0}, head {h0}",
                      updatemenus=[dict(buttons=buttons, direction="down", x=1.0, xanchor="right", y=1.15,
                                        showactive=True)] if len(chosen) > 1 else [],
                      xaxis=dict(title="key", tickangle=-45), yaxis=dict(title="query", autorange="reversed"),
                      height=max(420, 24 * n + 160), width=max(480, 24 * n + 220))
    return fig


@dataclass
class TokenView:
    """Tokens coloured by values; ``.html`` is a self-contained fragment (also ``_repr_html_``)."""

    tokens: list[str]
    values: list[float]
    html: str

    def _repr_html_(self) -> str:
        return self.html


def _colour(v: float, vmax: float) -> str:
    """White at 0, red for positive, blue for negative values (alpha proportional to |v| / vmax)."""
    a = 0.0 if vmax == 0 else min(1.0, abs(v) / vmax)
    rgb = "220,38,38" if v > 0 else "37,99,235"
    return f"rgba({rgb},{a:.3f})"


def token_view(tokens: Sequence[str], values: Sequence[float] | torch.Tensor, title: str | None = None,
               vmax: float | None = None) -> TokenView:
    """Each token on a background coloured by its value (red positive, blue negative, white zero; ``vmax``
    is the value of full colour, default the largest |value|); hovering shows the value."""
    vals = [float(v) for v in (values.detach().float().flatten().tolist() if isinstance(values, torch.Tensor)
                               else values)]
    if len(vals) != len(tokens):
        raise ValueError(f"{len(tokens)} tokens but {len(vals)} values")
    top = max((abs(v) for v in vals), default=0.0) if vmax is None else float(vmax)
    spans = []
    for t, v in zip(tokens, vals):
        text = _html.escape(t).replace(" ", "&nbsp;").replace("\n", "&#8629;")
        spans.append(f'<span title="{v:.4g}" data-value="{v:.6g}" style="background:{_colour(v, top)};'
                     f'padding:1px 2px;margin:0 1px;border-radius:3px;font-family:monospace">{text}</span>')
    head = f"<div style=\"font-weight:600;margin-bottom:4px\">{_html.escape(title)}</div>" if title else ""
    legend = (f'<div style="font-size:11px;color:#6b7280;margin-top:4px">colour scale: ±{top:.4g} '
              '(red positive, blue negative)</div>')
    body = f'<div class="interp-token-view" style="line-height:2">{head}{"".join(spans)}{legend}</div>'
    return TokenView(list(tokens), vals, body)


__all__ = ["TokenView", "attention_view", "token_view"]
