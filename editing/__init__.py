"""Weight editing: transcoders (train, splice, sae-lens format) and TCPE / ROME knowledge edits."""
from .transcoders import (Spliced, Transcoder, TranscoderMetrics, TranscoderTraining, TranscoderTrainingConfig,
                          evaluate_transcoder, harvest_pairs, splice, train_transcoder)

__all__ = ["Transcoder", "Spliced", "splice", "harvest_pairs", "TranscoderTrainingConfig", "TranscoderTraining",
           "train_transcoder", "TranscoderMetrics", "evaluate_transcoder"]
