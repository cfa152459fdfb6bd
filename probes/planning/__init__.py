"""Internal planning in language models (Ustaomeroglu, Askin et al., ICLR 2026): VQ-VAE summary codes and MI.

Sets of hidden states are compressed to discrete codes with a set VQ-VAE and compared with plug-in mutual
information: how far ahead a model plans (horizon), whether it keeps the path it did not take (branch
awareness), and where in depth and position decision information lives (block x layer maps).
"""
from .mi import (MIEstimate, conditional_mutual_information, entropy, miller_madow_bias, mutual_information,
                 normalized_mi, null_corrected_mi, relabel, shuffled_null)

__all__ = ["mutual_information", "conditional_mutual_information", "entropy", "shuffled_null", "null_corrected_mi",
           "normalized_mi", "miller_madow_bias", "MIEstimate", "relabel"]
