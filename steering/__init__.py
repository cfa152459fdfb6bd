"""Steering: methods that write directions into activations.

A :class:`SteeringMethod` fits :class:`SteeringVector` objects that turn themselves into capture-layer
interventions. Built-in methods (difference-in-means, directional ablation, RepIt) and third-party
methods (entry-point group ``interp.steering``) share one registry.
"""
