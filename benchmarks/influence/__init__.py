"""Reproduction of "Understanding the Emergence of Seemingly Useless Features in Next-Token Predictors" (Rofin,
Naghiyev & Hahn, ICLR 2026): ``interp reproduce influence``. The method (gradient components, myopic attention,
m-untied GPT-2, feature influence, Q(w)) is :mod:`interp.dynamics.influence` and :mod:`interp.dynamics.untied`."""
from .majority import VARIANTS, MajorityConfig, MajorityResult, influence_summary, majority_record, run_majority
from .q_domains import QDomainResult, QDomainsConfig, domain_corpora, run_q_domains
from .recipe import RECIPE, InfluenceConfig, InfluenceRecipe

__all__ = ["RECIPE", "InfluenceConfig", "InfluenceRecipe", "MajorityConfig", "MajorityResult", "QDomainResult",
           "QDomainsConfig", "VARIANTS", "domain_corpora", "influence_summary", "majority_record", "run_majority",
           "run_q_domains"]
