"""Weight editing: transcoders (train, splice, sae-lens format), TCPE / ROME knowledge edits, the KECode metrics
and feature interpretation. The TCPE reproduction (facts model, KECode-like toy, SmolLM2 facts) is the recipe
``interp reproduce tcpe`` (``benchmarks/tcpe/``)."""
from .transcoders import (Spliced, Transcoder, TranscoderMetrics, TranscoderTraining, TranscoderTrainingConfig,
                          default_corpus, default_transcoder, evaluate_transcoder, harvest_pairs, splice,
                          train_transcoder, train_transcoder_from_store)

__all__ = ["Transcoder", "Spliced", "splice", "harvest_pairs", "TranscoderTrainingConfig", "TranscoderTraining",
           "train_transcoder", "train_transcoder_from_store", "TranscoderMetrics", "evaluate_transcoder",
           "default_corpus", "default_transcoder"]
from .rome import (Edit, EditConfig, EditRequest, FineTuneConfig, MLPSite, TranscoderSite, compute_key, compute_v,
                   context_templates, default_second_moment, default_texts, edit_batch, fine_tune, kl_term, left_vector,
                   moment_diagnostics, rank_one, restrict, rome, scale_edit, second_moment, second_moments, tcpe,
                   tcpe_batch, weight_decay_term)

__all__ += ["EditRequest", "EditConfig", "Edit", "FineTuneConfig", "MLPSite", "TranscoderSite", "context_templates",
            "compute_key", "second_moment", "second_moments", "default_texts", "default_second_moment",
            "moment_diagnostics", "compute_v", "kl_term", "weight_decay_term", "left_vector", "rank_one", "restrict",
            "scale_edit", "rome", "tcpe", "tcpe_batch", "fine_tune", "edit_batch"]
from .kecode import KECodeScores, cluster_errors, kecode_scores

__all__ += ["KECodeScores", "kecode_scores", "cluster_errors"]
from .interpret import FeatureTokens, feature_top_tokens

__all__ += ["FeatureTokens", "feature_top_tokens"]
