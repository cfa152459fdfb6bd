"""Dynamics: analyses across depth and across training time.

ViT block-recurrence (Raptor), POLCA loss decomposition and gradient-component influence on features.
"""
