"""Moved: the grammar is :mod:`interp.data.grammar`, the ``zoo:toy-grammar`` model and its metrics are
:mod:`interp.apps.zoo.grammar`; this path works until interp 0.2 (each name read here warns)."""
from interp._moved import forward

__getattr__ = forward(__name__)  # the targets: interp._moved.FORWARDED
