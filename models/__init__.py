"""Secondary area: re-implementations of the non-interpretability ICLR 2026 papers.

One module (or small subpackage) per paper, each with a config dataclass holding the paper's defaults,
the method itself and an ``experiment`` function returning a typed result with a plotly figure.
Shared training utilities live in :mod:`models.common`. This package may use :mod:`interp` but never
an analyzer package.
"""
