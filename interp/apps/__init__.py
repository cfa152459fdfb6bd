"""The applications built on the kernel: what a user runs, not what an analyzer imports.

* :mod:`interp.apps.audit` — ``interp audit``: run the registered checks on a model (or a training run's
  checkpoints) and write the HTML/JSON report; the interface a check implements is the kernel's
  :mod:`interp.checks`.
* :mod:`interp.apps.reproduce` — ``interp reproduce``: run the registered paper recipes, judge their claims,
  write records.
* :mod:`interp.apps.cli` — the ``interp`` command line (mounts the sub-commands).
* :mod:`interp.apps.store_cli` — ``interp harvest`` over :func:`interp.store.harvest`.
* :mod:`interp.apps.ray_engine` — the Ray engine of harvests (declared in the entry-point group
  ``interp.harvest_engines``) and of multi-checkpoint audits.
* :mod:`interp.apps.gitstate` — the commit and dirty state both applications record.

The import rule (``tests/test_import_layers.py``): the applications import the kernel and the analyzers; neither
the kernel (``interp`` minus ``interp.apps``) nor an analyzer package imports an application.
"""
