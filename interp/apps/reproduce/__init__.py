"""``interp reproduce``: every paper's evidence one command away.

A paper's method is library code (``interp.steering.repit``, ``interp.probes.gavel``, ...); its reproduction is
a *recipe* in ``benchmarks/<paper>/`` (``interp.benchmarks.<paper>``) with a typed config and ``quick`` /
``full`` presets, stages that resume (:class:`interp.stages.Stages`), a claims file (the paper's number and
where it stands, our criterion and when it was fixed) and committed records. See docs/reproduce.md.

>>> from interp.apps.reproduce import reproduce
>>> runs = reproduce("sdm", preset="quick", out="repro")      # doctest: +SKIP
>>> runs[0].record.to_frame()                                  # doctest: +SKIP
"""
from .claims import Claim, Claims, ClaimsError, Criterion, Verdict, judge, load_claims, parse_claims
from .recipe import RECIPES, Outcome, Recipe, available_recipes, get_recipe
from .record import ReproductionRecord, committed_record, compare
from .runner import Run, reproduce, run_recipe, update_record

__all__ = ["Claim", "Claims", "ClaimsError", "Criterion", "Outcome", "RECIPES", "Recipe", "ReproductionRecord", "Run",
           "Verdict", "available_recipes", "committed_record", "compare", "get_recipe", "judge", "load_claims",
           "parse_claims", "reproduce", "run_recipe", "update_record"]
