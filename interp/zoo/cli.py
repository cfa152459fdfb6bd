"""Moved to :mod:`interp.apps.zoo.cli` (the zoo's command line is an application); this path works until interp 0.2.

A deprecated alias (see :mod:`interp._moved`): ``interp.zoo.cli`` is the same module object, with a warning.
"""
from interp._moved import alias

alias(__name__)
