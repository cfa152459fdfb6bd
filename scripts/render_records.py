#!/usr/bin/env python
"""Regenerate the result tables of README.md and docs/ from the committed records
(benchmarks/<paper>/records/<preset>/). Usage: .venv/bin/python scripts/render_records.py [--check]"""
import sys
from pathlib import Path

from interp.apps.reproduce.docs import render_files

root = Path(__file__).resolve().parent.parent
check = "--check" in sys.argv[1:]
changed = render_files(root, write=not check)
for f in changed:
    print(("out of date: " if check else "rendered: ") + str(f.relative_to(root)))
sys.exit(1 if check and changed else 0)
