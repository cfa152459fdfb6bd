"""Package layout: the analyzer folders at the top of the repository install under the ``interp``
namespace (``probes/`` -> ``interp.probes``, ...), so installing interp never claims a user's own
``import models`` or ``import steering``; the reproduction recipes (``benchmarks/<paper>/``) install as
``interp.benchmarks.<paper>``. Everything else lives in pyproject.toml."""
from setuptools import find_packages, setup

#: top-level folders installed as ``interp.<folder>``
NAMESPACED = ("probes", "steering", "editing", "dynamics", "models", "benchmarks")

packages = find_packages(include=["interp", "interp.*"])
package_dir = {"interp": "interp"}
for top in NAMESPACED:
    found = find_packages(include=[top, f"{top}.*"])
    packages += [f"interp.{p}" for p in found]
    package_dir[f"interp.{top}"] = top

setup(packages=packages, package_dir=package_dir)
