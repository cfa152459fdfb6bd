"""Deprecated alias of the moved module (see :mod:`interp._moved`): ``interp.zoo.cli`` is
:mod:`interp.apps.zoo.cli` (the zoo's command line is an application); this path works until interp 0.2."""
from interp._moved import alias

alias(__name__)
