"""Claims files: what a paper claims, what we count as reproducing it at CPU scale, and the verdict rules.

A recipe's ``claims.yaml`` (next to its ``recipe.py``)::

    paper: "RepIt: Representing Isolated Targets to Steer Language Models"
    digest: "interp papers digest, section 1"
    tolerances:                      # for `interp reproduce --check`, per measured field (default: exact to 1e-6 rel.)
      default: {rel: 1.0e-6, abs: 1.0e-9}
      target_refusal: {abs: 0.02}
      step_time_ratio: {ignore: true}  # wall-clock: not compared
    claims:
      - id: isolation                # a short token, unique in the file
        claim: "RepIt removes refusal on the target while non-targets keep it"
        paper: "target refusal 0.00, non-target 0.95"   # the paper's number(s), as text
        where: "Table 2"             # where it stands in the paper (table / figure / abstract)
        criteria:                    # our criterion for a CPU-scale reproduction: every one must hold
          - {metric: target_refusal, op: "<=", value: 0.2}
          - {metric: nontarget_kept, op: ">=", value: 0.9}
        fixed: 2026-11-20            # when this criterion was fixed
        changed:                     # only where it changed after results were seen
          original: "nontarget_kept >= 0.95"
          why: "..."
          date: 2026-11-28
        posthoc:                     # only where the criterion was first set after results were seen
          seen: "the quick run's target_refusal (0.1)"   # what had been seen
          date: 2026-11-20
        expect: {full: reproduced}   # the verdict the committed full record holds (checked by the tests)
        note: "..."                  # optional: the measured cause where it does not reproduce

Verdicts: a criterion on a list-valued metric (one value per seed) is evaluated per value. A claim is
``reproduced`` when every criterion holds for every value, ``not reproduced`` when none holds for any value,
``partly`` otherwise; ``error`` when the run raised or a metric is missing or not a number (an exception is
never "not reproduced").
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

VERDICTS = ("reproduced", "partly", "not reproduced", "error")
OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq}
_ID = re.compile(r"^[a-z0-9][a-z0-9_\-]*$")


class ClaimsError(ValueError):
    """A claims file is malformed; the message says which file and where."""


@dataclass(frozen=True)
class Criterion:
    """``metric op value``; ``metric`` names a field of the recipe's measurements."""

    metric: str
    op: str
    value: float

    def text(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"

    def holds(self, measured: float) -> bool:
        return bool(OPS[self.op](measured, self.value))


@dataclass(frozen=True)
class Change:
    original: str
    why: str
    date: str


@dataclass(frozen=True)
class PostHoc:
    """A criterion first set after results were seen (not changed: there was no earlier one)."""

    seen: str
    date: str


@dataclass(frozen=True)
class Claim:
    id: str
    claim: str
    paper: str
    where: str
    criteria: tuple[Criterion, ...]
    fixed: str
    changed: Change | None = None
    expect: Mapping[str, str] = field(default_factory=dict)
    note: str = ""
    posthoc: PostHoc | None = None

    def criterion_text(self) -> str:
        return " and ".join(c.text() for c in self.criteria)


@dataclass(frozen=True)
class Tolerance:
    """How close ``--check`` wants a metric to its committed value; ``ignore`` leaves it out of the
    comparison (wall-clock measurements), and with it the verdicts of claims that read only such metrics."""

    rel: float = 1e-6
    abs: float = 1e-9
    ignore: bool = False

    def close(self, a: float, b: float) -> bool:
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return True
        return abs(a - b) <= self.abs + self.rel * abs(b)


@dataclass(frozen=True)
class Claims:
    paper: str
    digest: str
    claims: tuple[Claim, ...]
    tolerances: Mapping[str, Tolerance] = field(default_factory=dict)
    source: str = ""

    def tolerance(self, metric: str) -> Tolerance:
        return self.tolerances.get(metric) or self.tolerances.get("default") or Tolerance()

    def metrics(self) -> set[str]:
        return {c.metric for claim in self.claims for c in claim.criteria}


# ----------------------------------------------------------------------------- loading
def _req(d: Mapping, key: str, where: str, kind: type | tuple = str) -> Any:
    if key not in d:
        raise ClaimsError(f"{where}: missing '{key}'")
    v = d[key]
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ClaimsError(f"{where}: '{key}' must be a {names}, got {type(v).__name__} ({v!r})")
    return v


def _date(v: Any, where: str) -> str:
    if isinstance(v, (_dt.date, _dt.datetime)):
        return v.isoformat()[:10]
    if isinstance(v, str):
        try:
            return _dt.date.fromisoformat(v).isoformat()
        except ValueError:
            pass
    raise ClaimsError(f"{where}: expected a date YYYY-MM-DD, got {v!r}")


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ClaimsError(f"{where}: expected a finite number, got {v!r}")
    return float(v)


def _tolerance(v: Any, where: str) -> Tolerance:
    if isinstance(v, Mapping) and set(v) == {"ignore"}:
        if v["ignore"] is not True:
            raise ClaimsError(f"{where}: 'ignore' takes true (leave the metric out of --check), got {v['ignore']!r}")
        return Tolerance(ignore=True)
    if not isinstance(v, Mapping) or not set(v) <= {"rel", "abs"} or not v:
        raise ClaimsError(f"{where}: a tolerance is {{rel: x, abs: y}} (either or both) or {{ignore: true}}, got {v!r}")
    rel, abs_ = _number(v.get("rel", 0.0), f"{where}.rel"), _number(v.get("abs", 0.0), f"{where}.abs")
    if rel < 0 or abs_ < 0:
        raise ClaimsError(f"{where}: a tolerance is not negative, got {dict(v)!r}")
    return Tolerance(rel=rel, abs=abs_)


class _Located(dict):
    """A mapping read from YAML that remembers the line it starts on (for ``file:line`` messages)."""

    line: int = 0


def _at(source: str, obj: Any) -> str:
    """``source:line`` where ``obj`` was read from a YAML file, else ``source``."""
    line = getattr(obj, "line", 0)
    return f"{source}:{line}" if line else source


def parse_claims(data: Any, source: str = "<claims>") -> Claims:
    """Validate a claims document (the parsed YAML); errors name the file and the place."""
    if not isinstance(data, Mapping):
        raise ClaimsError(f"{source}: the document must be a mapping with 'paper', 'digest' and 'claims'")
    unknown = set(data) - {"paper", "digest", "claims", "tolerances"}
    if unknown:
        raise ClaimsError(f"{source}: unknown top-level key(s) {sorted(unknown)}")
    paper = _req(data, "paper", source)
    dig = _req(data, "digest", source)
    raw = _req(data, "claims", source, list)
    if not raw:
        raise ClaimsError(f"{source}: 'claims' is empty")
    claims, seen = [], set()
    for i, c in enumerate(raw):
        where = f"{_at(source, c)}: claims[{i}]"
        if not isinstance(c, Mapping):
            raise ClaimsError(f"{where}: a claim is a mapping, got {type(c).__name__}")
        unknown = set(c) - {"id", "claim", "paper", "where", "criteria", "fixed", "changed", "expect", "note",
                            "posthoc"}
        if unknown:
            raise ClaimsError(f"{where}: unknown key(s) {sorted(unknown)}")
        cid = _req(c, "id", where)
        where = f"{_at(source, c)}: claim {cid!r}"
        if not _ID.fullmatch(cid) or cid in seen:
            raise ClaimsError(f"{where}: an id is a unique lower-case token (a-z, 0-9, _ and -), got {cid!r}")
        seen.add(cid)
        crits_raw = _req(c, "criteria", where, list)
        if not crits_raw:
            raise ClaimsError(f"{where}: 'criteria' is empty")
        crits = []
        for j, k in enumerate(crits_raw):
            w = f"{_at(source, k) if isinstance(k, Mapping) else where}: claim {cid!r}: criteria[{j}]"
            if not isinstance(k, Mapping) or set(k) != {"metric", "op", "value"}:
                raise ClaimsError(f"{w}: a criterion is {{metric: NAME, op: '>=', value: NUMBER}}, got {k!r}")
            if not isinstance(k["op"], str) or k["op"] not in OPS:
                raise ClaimsError(f"{w}: op must be one of {', '.join(OPS)}, got {k['op']!r}")
            crits.append(Criterion(_req(k, "metric", w), k["op"], _number(k["value"], f"{w}.value")))
        changed = None
        if c.get("changed") is not None:
            ch = c["changed"]
            w = f"{where}: changed"
            if not isinstance(ch, Mapping) or set(ch) != {"original", "why", "date"}:
                raise ClaimsError(f"{w}: needs exactly 'original', 'why' and 'date'")
            changed = Change(_req(ch, "original", w), _req(ch, "why", w), _date(ch["date"], f"{w}.date"))
        posthoc = None
        if c.get("posthoc") is not None:
            ph = c["posthoc"]
            w = f"{where}: posthoc"
            if not isinstance(ph, Mapping) or set(ph) != {"seen", "date"}:
                raise ClaimsError(f"{w}: needs exactly 'seen' (what results had been seen) and 'date'")
            posthoc = PostHoc(_req(ph, "seen", w), _date(ph["date"], f"{w}.date"))
        expect = c.get("expect") or {}
        if not isinstance(expect, Mapping) or any(v not in VERDICTS[:3] for v in expect.values()) \
                or not set(expect) <= {"quick", "full"}:
            raise ClaimsError(f"{where}: 'expect' maps a preset (quick, full) to one of {VERDICTS[:3]}, got {expect!r}")
        claims.append(Claim(id=cid, claim=_req(c, "claim", where), paper=str(_req(c, "paper", where, (str, int, float))),
                            where=_req(c, "where", where), criteria=tuple(crits), fixed=_date(c.get("fixed"), f"{where}.fixed"),
                            changed=changed, expect=dict(expect), note=str(c.get("note") or ""),
                            posthoc=posthoc))
    tols = {}
    raw_t = data.get("tolerances") or {}
    if not isinstance(raw_t, Mapping):
        raise ClaimsError(f"{source}: 'tolerances' is a mapping of metric -> {{rel, abs}}")
    for k, v in raw_t.items():
        tols[str(k)] = _tolerance(v, f"{_at(source, v if getattr(v, 'line', 0) else raw_t)}: tolerances.{k}")
    return Claims(paper=paper, digest=dig, claims=tuple(claims), tolerances=tols, source=source)


def _unique_key_loader():
    import yaml

    class Loader(yaml.SafeLoader):
        """YAML's safe loader that refuses a key given twice in one mapping (YAML would keep the last silently)."""

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice",
                                                            key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

        def construct_located_map(self, node):
            data = _Located()
            data.line = node.start_mark.line + 1
            yield data
            data.update(self.construct_mapping(node))

    Loader.add_constructor("tag:yaml.org,2002:map", Loader.construct_located_map)
    return Loader


def load_claims(path: str | Path) -> Claims:
    """Read and validate a claims YAML file (safe loader; no code is run)."""
    import yaml

    _UniqueKeyLoader = _unique_key_loader()
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ClaimsError(f"{path}: cannot read the claims file ({exc.strerror or exc})") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no code is run
    except RecursionError:
        raise ClaimsError(f"{path}: nested too deeply to be a claims file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ClaimsError(f"{path}: not valid YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
    return parse_claims(data, str(path))


# ----------------------------------------------------------------------------- verdicts
@dataclass
class Verdict:
    """The outcome of one claim on one run."""

    id: str
    verdict: str
    ours: str  # the measured values, as text
    passed: int = 0  # criterion evaluations that held ...
    total: int = 0  # ... out of
    error: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _values(measured: Mapping[str, Any], metric: str) -> list[float]:
    if metric not in measured:
        raise KeyError(f"the run measured no {metric!r} (measured: {', '.join(sorted(measured)) or 'nothing'})")
    v = measured[metric]
    vals = v if isinstance(v, (list, tuple)) else [v]
    if not vals:
        raise ValueError(f"{metric!r} is an empty list")
    out = []
    for x in vals:
        if isinstance(x, str) and x in ("inf", "-inf"):  # how a record writes an infinite measurement (standard JSON)
            x = float(x)
        if isinstance(x, bool) or not isinstance(x, (int, float)) or (isinstance(x, float) and math.isnan(x)):
            raise ValueError(f"{metric!r} is not a number: {x!r}")
        out.append(float(x))
    return out


def format_values(vals: list[float]) -> str:
    if len(vals) == 1:
        return f"{vals[0]:.4g}"
    mean = sum(vals) / len(vals)
    return f"{mean:.4g} [{min(vals):.4g}, {max(vals):.4g}] (n={len(vals)})"


def judge(claim: Claim, measured: Mapping[str, Any] | None, error: str | None = None) -> Verdict:
    """The verdict of ``claim`` on ``measured`` (``error``: the run raised; the verdict is then ``error``)."""
    if error is not None or measured is None:
        return Verdict(claim.id, "error", "–", error=error or "the run produced no measurements")
    passed = total = 0
    texts = []
    try:
        for crit in claim.criteria:
            vals = _values(measured, crit.metric)
            texts.append(f"{crit.metric} = {format_values(vals)}")
            passed += sum(crit.holds(v) for v in vals)
            total += len(vals)
    except (KeyError, ValueError) as exc:
        return Verdict(claim.id, "error", "; ".join(texts) or "–", error=str(exc.args[0] if exc.args else exc))
    verdict = "reproduced" if passed == total else "not reproduced" if passed == 0 else "partly"
    return Verdict(claim.id, verdict, "; ".join(texts), passed, total)


__all__ = ["Change", "PostHoc", "Claim", "Claims", "ClaimsError", "Criterion", "OPS", "Tolerance", "VERDICTS", "Verdict",
           "format_values", "judge", "load_claims", "parse_claims"]
