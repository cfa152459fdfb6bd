"""Secondary area: re-implementations of the non-interpretability ICLR 2026 papers.

One module (or small subpackage) per paper: the method, with config dataclasses holding the official
defaults and typed results. Each paper's reproduction (experiment drivers, run configs, claims and records)
is its recipe in ``benchmarks/<paper>/`` (``interp reproduce <paper>``), which imports the method, never the
reverse. The training kit (seeding, thread limits, schedules, the small-LM trainer) is :mod:`interp.training`; shared data helpers live in :mod:`interp.models.common`. This package may use :mod:`interp`
but never an analyzer package.
"""

from .spiked_regression import SpikedSimulationConfig

__all__ = ["SpikedSimulationConfig"]
