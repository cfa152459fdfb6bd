"""Reproduction recipes, one package per paper (``interp.benchmarks.<paper>``, run by ``interp reproduce``),
and speed comparisons (``benchmarks/speed/``, scripts). A recipe imports its paper's method from the library;
the library never imports a recipe."""
