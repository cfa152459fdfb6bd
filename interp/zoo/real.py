"""Moved to :mod:`interp.apps.zoo.real` (the built-in entries' builders are applications); this path works until
interp 0.2 (each name read here warns)."""
from interp._moved import forward

__getattr__ = forward(__name__)  # the targets: interp._moved.FORWARDED
