"""The built-in zoo entries and their builders (applications: they train or convert models).

:mod:`.zoo` declares the entries (``pyproject.toml``'s ``interp.zoo`` entry points name its ``entries``);
:mod:`.real` converts the real models shipped in packages (SmolLM2, MiniLM, DINOv2), :mod:`.refusal` safety-tunes
SmolLM2, :mod:`.grammar` trains the toy-grammar Llama; :mod:`.cli` is ``interp zoo ...``. The registry, the cache and loading stay in the kernel
(:mod:`interp.zoo`), which finds these entries through the entry points and never imports this package.
"""
