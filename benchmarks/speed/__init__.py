"""Speed and memory comparisons, side by side with the libraries users would otherwise use (scripts: run
``python benchmarks/speed/<name>.py``; results in ``benchmarks/speed/results/``)."""
