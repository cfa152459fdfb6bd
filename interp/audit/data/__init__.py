"""Built-in text set of ``interp audit`` (``texts.txt``: one input per line)."""
