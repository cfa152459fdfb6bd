"""GAVEL (Rozenfeld et al., ICLR 2026): cognitive-element (CE) detectors on attention readouts, a rule
language over CEs, and real-time rule enforcement during generation.

- :mod:`.rules`: ``parse_rule``, ``Rule`` (``evaluate``/``score``/``ces``), ``RuleSyntaxError``, rule files;
- :mod:`.features`: ``FeatureSpec``, ``conversation_features`` (``attn.hook_z``, GQA-grouped, assistant tokens);
- :mod:`.detector`: ``train_detector`` (windowed bidirectional GRU), ``compute_triggers``, ``calibrate`` (Youden's J);
- :mod:`.ce`: ``CE`` folders, ``CELibrary``, ``elicit`` (ERI);
- :mod:`.evaluation`: the harness with the monolithic-classifier and keyword baselines, and ``template_detector``
  (the built-in detector of any model, trained on :mod:`.library` once per model and cached);
- :mod:`.monitor`: ``Monitor`` (real-time enforcement inside ``model.generate``);
- :mod:`.propose`: ``propose_rule`` (automated rule creation);
- :mod:`.labels`: window targets from sentence-level CE annotations (``token_ce_labels``, ``window_labels``);
- :mod:`.library`: the template CE library (10 CEs, scenarios, held-out templates: a data set);
- :mod:`.audit`: the ``gavel`` audit check.

The reproduction (CE world, SmolLM2 runs) is a recipe apart from the method: ``interp reproduce gavel``
(``benchmarks/gavel/``).

See docs/gavel.md.
"""
from .rules import (ACTIONS, And, Or, Rule, RuleSet, RuleSyntaxError, Selector, load_rules, parse_condition,
                    parse_rule, rule_from_json)

__all__ = ["ACTIONS", "And", "Or", "Rule", "RuleSet", "RuleSyntaxError", "Selector", "load_rules",
           "parse_condition", "parse_rule", "rule_from_json"]
from .detector import (Calibration, CalibrationLabels, CEDetector, DetectorConfig, TrainingHistory, WindowGRU,
                       balance_classes, calibrate, compute_triggers, labels_for_rule, make_windows, split_train_val,
                       train_detector, window_bounds)
from .features import (FeatureSpec, conversation_features, conversation_runs, default_spec, encode_conversation,
                       group_readout, scored_runs, text_features)

__all__ += ["Calibration", "CalibrationLabels", "CEDetector", "DetectorConfig", "TrainingHistory", "WindowGRU",
            "balance_classes", "calibrate", "compute_triggers", "labels_for_rule", "make_windows", "split_train_val",
            "train_detector", "window_bounds", "FeatureSpec", "conversation_features", "conversation_runs", "default_spec",
            "encode_conversation", "group_readout", "scored_runs", "text_features"]
from .evaluation import (TEMPLATE_DETECTOR, KeywordMatcher, MonolithicClassifier, RuleEvaluation, gavel_rule_outputs,
                         rule_metrics, template_detector, train_monolithic, train_text_detector)
from .labels import labelled_windows, token_ce_labels, window_labels

__all__ += ["TEMPLATE_DETECTOR", "template_detector", "KeywordMatcher", "MonolithicClassifier", "RuleEvaluation", "gavel_rule_outputs", "rule_metrics",
            "train_monolithic", "train_text_detector", "labelled_windows", "token_ce_labels", "window_labels"]
from .monitor import Monitor, MonitorOutput, render_prompt

__all__ += ["Monitor", "MonitorOutput", "render_prompt"]
from .ce import CE, ERI_TEMPLATE, CELibrary, elicit

__all__ += ["CE", "ERI_TEMPLATE", "CELibrary", "elicit"]
from .propose import RuleProposal, propose_rule

__all__ += ["RuleProposal", "propose_rule"]
