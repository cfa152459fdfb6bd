"""Weight editing: transcoders (train, splice, sae-lens format) and TCPE / ROME knowledge edits."""
from .transcoders import (Spliced, Transcoder, TranscoderMetrics, TranscoderTraining, TranscoderTrainingConfig,
                          evaluate_transcoder, harvest_pairs, splice, train_transcoder,
                          train_transcoder_from_store)

__all__ = ["Transcoder", "Spliced", "splice", "harvest_pairs", "TranscoderTrainingConfig", "TranscoderTraining",
           "train_transcoder", "train_transcoder_from_store", "TranscoderMetrics", "evaluate_transcoder"]
from .rome import (Edit, EditConfig, EditRequest, FineTuneConfig, MLPSite, TranscoderSite, compute_key, compute_v,
                   context_templates, edit_batch, fine_tune, left_vector, moment_diagnostics, rank_one, restrict, rome, second_moment,
                   second_moments,
                   tcpe)

__all__ += ["EditRequest", "EditConfig", "Edit", "FineTuneConfig", "MLPSite", "TranscoderSite", "context_templates",
            "compute_key", "second_moment", "second_moments", "moment_diagnostics", "compute_v", "left_vector", "rank_one", "restrict", "rome", "tcpe", "fine_tune",
            "edit_batch"]
from .facts import FactsComparison, FactsTask, compare_methods, fact_predictions, train_facts_model

__all__ += ["FactsTask", "train_facts_model", "fact_predictions", "FactsComparison", "compare_methods"]
from .kecode import KECodeScores, cluster_errors, kecode_scores

__all__ += ["KECodeScores", "kecode_scores", "cluster_errors"]
from .interpret import FeatureTokens, feature_top_tokens

__all__ += ["FeatureTokens", "feature_top_tokens"]
from .kecode_toy import CodeTask, ErrorClusters, KECodeComparison, compare_kecode, train_code_model

__all__ += ["CodeTask", "train_code_model", "ErrorClusters", "KECodeComparison", "compare_kecode"]
from .real_facts import Fact, RealEditComparison, all_facts, compare_real, known_facts

__all__ += ["Fact", "all_facts", "known_facts", "RealEditComparison", "compare_real"]
