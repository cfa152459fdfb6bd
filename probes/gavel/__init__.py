"""GAVEL (Rozenfeld et al., ICLR 2026): cognitive-element (CE) detectors on attention readouts, a rule
language over CEs, and real-time rule enforcement during generation.

- :mod:`.rules`: ``parse_rule``, ``Rule`` (``evaluate``/``score``/``ces``), ``RuleSyntaxError``, rule files.
"""
from .rules import (ACTIONS, And, Or, Rule, RuleSet, RuleSyntaxError, Selector, load_rules, parse_condition,
                    parse_rule, rule_from_json)

__all__ = ["ACTIONS", "And", "Or", "Rule", "RuleSet", "RuleSyntaxError", "Selector", "load_rules",
           "parse_condition", "parse_rule", "rule_from_json"]
