"""Moved: the grammar is :mod:`interp.data.grammar`, the ``zoo:toy-grammar`` model and its metrics are
:mod:`interp.apps.zoo.grammar`; this path works until interp 0.2 (each name read here warns)."""
from ._forward import forward

_APP = "interp.apps.zoo.grammar"
__getattr__ = forward(__name__, {n: _APP for n in ("ToyGrammarConfig", "make_tokenizer", "evaluate",
                                                   "build_toy_grammar")}, "interp.data.grammar")
