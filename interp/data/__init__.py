"""interp.data: the data that analyzers, notebooks and the zoo's training recipes share (public API).

* :mod:`.refusal` — the category-labelled refusal instruction set (``refusal_instructions``, splits by task),
  the refusal judge (``is_refusal``), chat formatting (``format_chat``), and held-out real text
  (``kjv_text``, ``heldout_text``: the King James Bible from a package, with the Book of Ruth held out);
* :mod:`.behaviours` — small contrastive behaviour sets (``sentiment``, ``uppercase``) with neutral prompts and
  marker continuations, for fitting and judging any steering method (``get_behaviour``, ``load_behaviour``);
* :mod:`.corpus` — the default real-text corpus of methods given no text (``text_passages``: KJV passages spread
  over the book);
* :mod:`.digits` — real images: the scikit-learn handwritten digits as ViT-ready tensors (``digits_images``;
  ``digits_sample``: the vision analyzers' default sample at a side the model takes);
* :mod:`.grammar` — a probabilistic context-free grammar with exactly known continuations (``ToyGrammar``: the
  language of ``zoo:toy-grammar`` and of the planning recipe's ``cfg`` task; imported on use);
* ``package_dir`` — the folder of an installed package that ships data or weights, found without importing it.

(The language of ``zoo:toy-refusal``, which only the RepIt reproduction uses, is
:mod:`interp.benchmarks.repit.toy_data`.)

Nothing here imports a model or a training recipe; the zoo's builders (:mod:`interp.apps.zoo`) import from here.
"""
from __future__ import annotations

from . import behaviours, corpus, digits, refusal
from .behaviours import BEHAVIOURS, Behaviour, behaviour_names, get_behaviour, load_behaviour
from .corpus import text_passages
from ._packages import package_dir
from .digits import digits_images, digits_sample
from .refusal import (HARMFUL_CATEGORIES, REFUSAL_OPENERS, Instruction, category_names, category_tasks, format_chat,
                      heldout_text, is_refusal, kjv_text, refusal_instructions, refusal_response)

__all__ = ["behaviours", "Behaviour", "BEHAVIOURS", "behaviour_names", "get_behaviour", "load_behaviour", "corpus", "text_passages", "digits", "digits_images", "digits_sample", "refusal", "Instruction", "HARMFUL_CATEGORIES", "REFUSAL_OPENERS", "category_names",
           "category_tasks", "refusal_instructions", "refusal_response", "is_refusal", "format_chat", "kjv_text",
           "heldout_text", "package_dir"]
