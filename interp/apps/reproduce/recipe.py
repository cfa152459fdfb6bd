"""The recipe interface: how a paper's reproduction plugs into ``interp reproduce``.

A recipe lives in ``benchmarks/<paper>/recipe.py`` (installed as ``interp.benchmarks.<paper>``), beside its
``claims.yaml`` and ``records/``, and is declared in the entry-point group ``interp.recipes`` (the only way a
recipe registers; a new entry point is visible once the package is reinstalled, ``pip install -e .``). It imports
the paper's method from the library; the library never imports a recipe.

A recipe is a :class:`Recipe` subclass with a typed ``Config`` dataclass and at least the presets ``quick``
(small, but every stage and every verdict runs; all quick presets together finish in about ten minutes on
two CPU cores from an empty cache) and ``full`` (the CPU-scale run the docs report). Its work is split into
*units* (seeds, configurations) that are independent of one another: :meth:`Recipe.units` lists them,
:meth:`Recipe.run_unit` computes one (through the run's :class:`interp.stages.Stages`, so it resumes), and
:meth:`Recipe.combine` turns the units' outputs into an :class:`Outcome`: the measured values that the
claims file's criteria read, tables and figures. The local engine runs the units in order; ``--engine ray``
runs them as Ray tasks and must give the same outcome.
"""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Sequence

from interp.registry import Registry
from .claims import Claims, load_claims

#: entry-point group of recipes (``name = "module:RecipeClass"``)
ENTRY_POINT_GROUP = "interp.recipes"
PRESETS = ("quick", "full")


@dataclass
class Outcome:
    """What a run measured.

    ``measured``: metric name -> a number, a list of numbers (one per seed or unit: verdicts are evaluated per
    value and the report shows the spread) or a short string; the claims file's criteria name these metrics.
    ``tables``: caption -> rows (list of dicts), stored in the record. ``figures``: ``(caption, plotly figure)``
    pairs, drawn in the report (not stored). ``notes``: free text for the report (what to read into the
    numbers; the measured cause where a claim does not reproduce).
    """

    measured: dict[str, Any]
    tables: dict[str, list[dict]] = field(default_factory=dict)
    figures: list[tuple[str, Any]] = field(default_factory=list)
    notes: str = ""


class Recipe:
    """Base class of reproduction recipes (see the module docstring). Subclasses set the class attributes and
    implement :meth:`run_unit` and :meth:`combine` (and :meth:`units` when the run has several)."""

    #: the paper's short name (the CLI's PAPER argument and the entry-point name)
    name: ClassVar[str] = ""
    #: the paper's title
    title: ClassVar[str] = ""
    #: where the method lives (repository-relative), the doc and the notebook
    method: ClassVar[str] = ""
    doc: ClassVar[str] = ""
    notebook: ClassVar[str | None] = None
    #: the run config's dataclass and its presets (at least ``quick`` and ``full``)
    Config: ClassVar[type] = type(None)
    presets: ClassVar[dict[str, Any]] = {}
    #: the cost of each preset on 2 CPU cores, as text (the docs state it)
    cost: ClassVar[dict[str, str]] = {}
    #: modules whose source keys the stages (default: the recipe's own package); list the method's modules too
    code: ClassVar[tuple[str, ...]] = ()

    # -------------------------------------------------------------- the work
    def units(self, config: Any) -> list[Any]:
        """The independent units of a run (JSON values: seeds, settings). Default: one unit, ``None``."""
        return [None]

    def run_unit(self, config: Any, unit: Any, stages: Any) -> Any:  # pragma: no cover - abstract
        """Compute one unit; its output (JSON values, tensors, results) goes to :meth:`combine`."""
        raise NotImplementedError

    def combine(self, config: Any, outputs: list[Any]) -> Outcome:  # pragma: no cover - abstract
        """Turn the units' outputs (in :meth:`units` order) into the run's :class:`Outcome`."""
        raise NotImplementedError

    # -------------------------------------------------------------- where things are
    @classmethod
    def folder(cls) -> Path:
        """The recipe's folder (``benchmarks/<paper>/``)."""
        return Path(inspect.getfile(cls)).resolve().parent

    @classmethod
    def claims(cls) -> Claims:
        return load_claims(cls.folder() / "claims.yaml")

    @classmethod
    def records_dir(cls) -> Path:
        return cls.folder() / "records"

    @classmethod
    def code_sources(cls) -> tuple[str, ...]:
        return tuple(cls.code) or (cls.__module__.rsplit(".", 1)[0],)

    @classmethod
    def preset(cls, name: str) -> Any:
        """The config of preset ``name`` (a copy)."""
        if name not in cls.presets:
            raise ValueError(f"recipe {cls.name!r} has no preset {name!r}; presets: {', '.join(cls.presets)}")
        return dataclasses.replace(cls.presets[name])


def _validate(obj: Any, name: str | None) -> None:
    if not (isinstance(obj, type) and issubclass(obj, Recipe)):
        raise TypeError(f"a recipe is a subclass of interp.apps.reproduce.Recipe, got {obj!r}")
    if name is not None and obj.name != name:
        raise ValueError(f"recipe class {obj.__qualname__} is named {obj.name!r}, declared as {name!r}")
    missing = [p for p in PRESETS if p not in obj.presets]
    if missing:
        raise ValueError(f"recipe {obj.name!r} lacks the preset(s) {missing}")
    for p, cfg in obj.presets.items():
        if not isinstance(cfg, obj.Config):
            raise TypeError(f"recipe {obj.name!r}: preset {p!r} is a {type(cfg).__name__}, not a {obj.Config.__name__}")


#: the recipes (entry-point group ``interp.recipes``)
RECIPES: Registry[type] = Registry("recipe", ENTRY_POINT_GROUP, validate=_validate)


def available_recipes() -> list[str]:
    return RECIPES.available()


def get_recipe(name: str) -> type[Recipe]:
    """The recipe class named ``name`` (unknown names raise a ``KeyError`` naming the closest)."""
    return RECIPES.get(name)


def resolve(names: Sequence[str] | str) -> list[str]:
    """``"all"`` -> every recipe; otherwise the names themselves (validated)."""
    names = [names] if isinstance(names, str) else list(names)
    if names == ["all"]:
        return available_recipes()
    for n in names:
        get_recipe(n)
    return names


__all__ = ["ENTRY_POINT_GROUP", "Outcome", "PRESETS", "RECIPES", "Recipe", "available_recipes", "get_recipe",
           "resolve"]
