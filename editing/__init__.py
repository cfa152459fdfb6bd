"""Editing: analyzers that write weights.

Transcoders (trained here or loaded in sae-lens format) and TransCoder-based precise editing (TCPE).
"""
