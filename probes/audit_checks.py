"""Deprecated alias of the moved module (see :mod:`interp._moved`): ``interp.probes.audit_checks`` works until interp 0.2."""
from interp._moved import alias

alias(__name__)
