"""Block-recurrent dynamics in vision transformers (Jacobs, Fel, Hakim et al., ICLR 2026): layer phases and Raptor.

``layer_distances`` / ``phases``: the layer x layer similarity of block outputs and its partition into phases.
"""
from .phases import (LayerDistances, Phases, cut_value, distances_from_stack, dp_phases, layer_distances,
                     maxcut_phases, phases, token_summaries)

__all__ = ["LayerDistances", "Phases", "cut_value", "distances_from_stack", "dp_phases", "layer_distances",
           "maxcut_phases", "phases", "token_summaries"]
