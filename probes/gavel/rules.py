"""GAVEL's rule language: a recursive-descent parser, the JSON form, evaluation, scoring and rule files.

Grammar (the public ``gavel-rules`` library's, with inline groups as in the paper's examples)::

    condition := conj ("or" conj)*
    conj      := atom ("and" atom)*
    atom      := ("all" | INTEGER) "of" group | "(" condition ")"
    group     := "{" CE ("," CE)* "}" | GROUP_NAME

``k of g`` holds when at least ``k`` distinct CEs of ``g`` fired anywhere in the conversation, ``all of g``
when every one did. ``and`` binds tighter than ``or``; parentheses override. ``not`` is reserved and
rejected (the library defines no calibration semantics for negation). A named group refers to the rule's
``groups`` mapping (the library's ``rule.yaml`` form); inline ``{a, b}`` groups need none.

The paper repository's JSON form ``{"all_required": [...], "any_of": [[...], ...], "supporting": [...]}``
means ``all of {required} and 1 of {g_1} and ... and 1 of {g_n}``; supporting CEs never decide the rule
(they are neutral during calibration).

Continuous score (digest §2, inference step 5): with ``s_c`` a CE's score, ``all of g`` scores
``min_{c in g} s_c``, ``1 of g`` scores ``max_{c in g} s_c``, and generally ``k of g`` scores the ``k``-th
largest ``s_c`` in ``g`` (the largest value ``t`` such that ``k`` CEs of ``g`` reach ``t``, which is exactly
what makes ``score >= θ`` equivalent to ``evaluate`` on CEs thresholded at θ); ``and`` takes the minimum and
``or`` the maximum of its operands. For the JSON form this is the digest's
``min(min_{c in required} s_c, min_g max_{c in g} s_c)``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence, Union

__all__ = ["RuleSyntaxError", "Selector", "And", "Or", "Rule", "RuleSet", "parse_rule", "parse_condition",
           "rule_from_json", "load_rules", "ACTIONS", "MAX_DEPTH"]

#: actions a rule may take when it fires in a :class:`~interp.probes.gavel.Monitor`
ACTIONS = ("block", "replace", "redirect", "flag")
_KEYWORDS = {"all", "of", "and", "or", "not"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: deepest nesting of parentheses a condition may have (the parser recurses once per level)
MAX_DEPTH = 100
_DIGITS = "0123456789"


class RuleSyntaxError(ValueError):
    """A malformed rule: the message names the line, column and what was expected."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None, text: str | None = None):
        self.line, self.column, self.text = line, column, text
        where = f"line {line}, column {column}: " if line is not None else ""
        snippet = ""
        if text is not None and line is not None and column is not None:
            lines = text.split("\n")  # the lexer counts lines by "\n": an error after a final newline is on ""
            src = lines[line - 1] if 0 < line <= len(lines) else ""
            snippet = f"\n  {src}\n  {' ' * (column - 1)}^"
        super().__init__(f"{where}{message}{snippet}")


# ----------------------------------------------------------------------------------------------- AST
@dataclass(frozen=True)
class Selector:
    """``k of g`` (``k=None`` means ``all``). ``ces`` is the group's CEs in written order; a group never lists a CE
    twice (the parser refuses it: the official matcher would count a repeated CE twice, so ``2 of {tax, tax,
    go}`` would fire on ``tax`` alone)."""

    k: int | None
    ces: tuple[str, ...]
    group: str | None = None  #: the group's name when it was referenced by name

    @property
    def need(self) -> int:
        return len(self.ces) if self.k is None else self.k

    def evaluate(self, fired: frozenset[str]) -> bool:
        return sum(c in fired for c in self.ces) >= self.need

    def score(self, scores: Mapping[str, float]) -> float:
        vals = sorted((float(scores[c]) for c in self.ces), reverse=True)
        return vals[self.need - 1]

    def render(self) -> str:
        grp = self.group if self.group is not None else "{" + ", ".join(self.ces) + "}"
        return f"{'all' if self.k is None else self.k} of {grp}"


@dataclass(frozen=True)
class And:
    items: tuple["Node", ...]

    def evaluate(self, fired: frozenset[str]) -> bool:
        return all(i.evaluate(fired) for i in self.items)

    def score(self, scores: Mapping[str, float]) -> float:
        return min(i.score(scores) for i in self.items)

    def render(self) -> str:
        return " and ".join(f"({i.render()})" if isinstance(i, Or) else i.render() for i in self.items)


@dataclass(frozen=True)
class Or:
    items: tuple["Node", ...]

    def evaluate(self, fired: frozenset[str]) -> bool:
        return any(i.evaluate(fired) for i in self.items)

    def score(self, scores: Mapping[str, float]) -> float:
        return max(i.score(scores) for i in self.items)

    def render(self) -> str:
        return " or ".join(i.render() for i in self.items)


Node = Union[Selector, And, Or]


def _selectors(node: Node) -> Iterable[Selector]:
    if isinstance(node, Selector):
        yield node
    else:
        for i in node.items:
            yield from _selectors(i)


# ------------------------------------------------------------------------------------------- lexer
@dataclass(frozen=True)
class _Tok:
    kind: str  # NAME INT KW { } ( ) , EOF
    value: str
    line: int
    col: int


def _lex(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    line, col, i = 1, 1, 0
    while i < len(text):
        ch = text[i]
        if ch == "\n":
            line, col, i = line + 1, 1, i + 1
            continue
        if ch.isspace():
            col, i = col + 1, i + 1
            continue
        if ch == "#":  # comment to the end of the line
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        if ch in "{}(),":
            toks.append(_Tok(ch, ch, line, col))
            col, i = col + 1, i + 1
            continue
        if ch in _DIGITS or (ch == "-" and i + 1 < len(text) and text[i + 1] in _DIGITS):
            j = i + 1
            while j < len(text) and text[j] in _DIGITS:
                j += 1
            toks.append(_Tok("INT", text[i:j], line, col))
            col, i = col + (j - i), j
            continue
        m = _NAME.match(text, i)
        if m:
            word = m.group(0)
            toks.append(_Tok("KW" if word in _KEYWORDS else "NAME", word, line, col))
            col, i = col + len(word), m.end()
            continue
        raise RuleSyntaxError(f"unexpected character {ch!r}; expected a CE or group name, a number, "
                              f"'all', 'of', 'and', 'or', braces, parentheses or a comma", line, col, text)
    toks.append(_Tok("EOF", "", line, col))
    return toks


def _describe(tok: _Tok) -> str:
    return "end of rule" if tok.kind == "EOF" else repr(tok.value)


class _Parser:
    def __init__(self, text: str, groups: Mapping[str, Sequence[str]] | None, known: set[str] | None):
        self.text, self.groups, self.known = text, dict(groups or {}), known
        self.toks, self.i = _lex(text), 0
        self.used_groups: set[str] = set()
        self.depth = 0

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def err(self, tok: _Tok, expected: str) -> RuleSyntaxError:
        if tok.kind == "KW" and tok.value == "not":
            return RuleSyntaxError("negation ('not') is reserved and not supported: rules are monotone "
                                   f"(expected {expected})", tok.line, tok.col, self.text)
        return RuleSyntaxError(f"expected {expected}, found {_describe(tok)}", tok.line, tok.col, self.text)

    def take(self, kind: str, value: str | None, expected: str) -> _Tok:
        tok = self.peek()
        if tok.kind != kind or (value is not None and tok.value != value):
            raise self.err(tok, expected)
        self.i += 1
        return tok

    def parse(self) -> Node:
        node = self.condition()
        tok = self.peek()
        if tok.kind != "EOF":
            raise self.err(tok, "'and', 'or', ')' or the end of the rule")
        return node

    def condition(self) -> Node:
        items = [self.conj()]
        while self.peek().kind == "KW" and self.peek().value == "or":
            self.i += 1
            items.append(self.conj())
        return items[0] if len(items) == 1 else Or(tuple(items))

    def conj(self) -> Node:
        items = [self.atom()]
        while self.peek().kind == "KW" and self.peek().value == "and":
            self.i += 1
            items.append(self.atom())
        return items[0] if len(items) == 1 else And(tuple(items))

    def atom(self) -> Node:
        tok = self.peek()
        if tok.kind == "(":
            if self.depth >= MAX_DEPTH:
                raise RuleSyntaxError(f"parentheses nested deeper than {MAX_DEPTH} levels", tok.line, tok.col,
                                      self.text)
            self.i += 1
            self.depth += 1
            node = self.condition()
            self.depth -= 1
            self.take(")", None, "')' closing the '(' at line %d, column %d" % (tok.line, tok.col))
            return node
        if tok.kind == "KW" and tok.value == "all":
            self.i += 1
            k = None
        elif tok.kind == "INT":
            self.i += 1
            if len(tok.value.lstrip("-")) > 9:
                raise RuleSyntaxError(f"k in 'k of' is too large ({tok.value[:12]}...); k is at most the group size",
                                      tok.line, tok.col, self.text)
            k = int(tok.value)
            if k < 1:
                raise RuleSyntaxError(f"k in 'k of' must be at least 1, got {k}", tok.line, tok.col, self.text)
        else:
            raise self.err(tok, "'all', a number k (as in 'k of {...}') or '('")
        self.take("KW", "of", "'of'")
        ces, gname, gtok = self.group()
        if k is not None and k > len(ces):
            raise RuleSyntaxError(f"'{k} of' needs at least {k} CEs but the group has {len(ces)} "
                                  f"({', '.join(ces)}); k must be between 1 and the group size",
                                  tok.line, tok.col, self.text)
        return Selector(k, ces, gname)

    def group(self) -> tuple[tuple[str, ...], str | None, _Tok]:
        tok = self.peek()
        if tok.kind == "NAME":
            self.i += 1
            if tok.value not in self.groups:
                known = ", ".join(sorted(self.groups)) or "none defined"
                raise RuleSyntaxError(f"unknown group {tok.value!r} (groups: {known}); write an inline group "
                                      "like {ce_a, ce_b} or define it under 'groups'", tok.line, tok.col, self.text)
            self.used_groups.add(tok.value)
            ces = tuple(self.groups[tok.value])
            dup = _repeated(ces)
            if dup:
                raise RuleSyntaxError(f"group {tok.value!r} lists {', '.join(dup)} more than once; list each CE once "
                                      "(the official matcher would count a repeated CE twice)", tok.line, tok.col,
                                      self.text)
            for c in ces:
                self.check_ce(c, tok)
            return ces, tok.value, tok
        if tok.kind != "{":
            raise self.err(tok, "a group: '{' or a group name")
        self.i += 1
        if self.peek().kind == "}":
            raise RuleSyntaxError("empty group: a group needs at least one CE", self.peek().line, self.peek().col,
                                  self.text)
        ces: list[str] = []
        seen: set[str] = set()  # membership by hash: a list search made a group of n CEs cost O(n^2)
        while True:
            ctok = self.peek()
            if ctok.kind != "NAME":
                raise self.err(ctok, "a CE name")
            self.i += 1
            self.check_ce(ctok.value, ctok)
            if ctok.value in seen:
                raise RuleSyntaxError(f"CE {ctok.value!r} is listed twice in this group; list each CE once (the "
                                      "official matcher would count a repeated CE twice, so '2 of {a, a, b}' would "
                                      "fire on a alone)", ctok.line, ctok.col, self.text)
            ces.append(ctok.value)
            seen.add(ctok.value)
            nxt = self.peek()
            if nxt.kind == ",":
                self.i += 1
                continue
            if nxt.kind == "}":
                self.i += 1
                break
            raise self.err(nxt, "',' or '}'")
        return tuple(ces), None, tok

    def check_ce(self, name: str, tok: _Tok) -> None:
        if self.known is not None and name not in self.known:
            raise RuleSyntaxError(f"unknown CE {name!r}; known CEs: {', '.join(sorted(self.known))}",
                                  tok.line, tok.col, self.text)


def _repeated(names: Sequence[str]) -> list[str]:
    """The names listed more than once in ``names``, sorted (one pass: counting with ``list.count`` per name
    is quadratic in the length of the list)."""
    seen: set[str] = set()
    dup: set[str] = set()
    for n in names:
        (dup if n in seen else seen).add(n)
    return sorted(dup)


def _ce_names(value: object, field: str, allow_empty: bool = True, iterable: bool = False) -> list[str]:
    """``value`` as a list of CE names; a string (which iteration would split into characters), a non-list or
    an entry that is not a CE name raises :class:`RuleSyntaxError` naming ``field``. ``iterable``: any
    iterable of names is accepted (API arguments typed ``Iterable[str]``; a mapping gives its keys)."""
    if isinstance(value, (str, bytes)):
        raise RuleSyntaxError(f"{field!r} must be a list of CE names, got the string {value!r} (for one CE write "
                              f"[{value}])")
    if isinstance(value, (set, frozenset)):
        value = sorted(value, key=str)
    elif iterable and not isinstance(value, (list, tuple)) and isinstance(value, Iterable):
        value = list(value)
    if not isinstance(value, (list, tuple)):
        raise RuleSyntaxError(f"{field!r} must be a list of CE names, got {type(value).__name__} {value!r}")
    for c in value:
        if not isinstance(c, str) or not _NAME.fullmatch(c) or c in _KEYWORDS:
            raise RuleSyntaxError(f"{field!r}: bad CE name {c!r} (a CE name is a string of letters, digits and "
                                  "'_', not a keyword)")
    if not value and not allow_empty:
        raise RuleSyntaxError(f"{field!r} must list at least one CE")
    return list(value)


def parse_condition(text: str, groups: Mapping[str, Sequence[str]] | None = None,
                    known_ces: Iterable[str] | None = None) -> Node:
    """Parse a condition into its syntax tree (see the module docstring for the grammar)."""
    if not isinstance(text, str):
        raise TypeError(f"a rule condition must be a string, got {type(text).__name__}")
    known = None if known_ces is None else set(_ce_names(known_ces, "known_ces", iterable=True))
    if groups is not None and not isinstance(groups, Mapping):
        raise RuleSyntaxError(f"'groups' must be a mapping of group names to lists of CE names, got "
                              f"{type(groups).__name__}")
    for gname, members in (groups or {}).items():
        if not isinstance(gname, str) or not _NAME.fullmatch(gname) or gname in _KEYWORDS:
            raise RuleSyntaxError(f"bad group name {gname!r}: use letters, digits and '_' and no keyword")
        if isinstance(members, str) or not isinstance(members, (list, tuple)) or not list(members):
            raise RuleSyntaxError(f"group {gname!r} must be a non-empty list of CE names, got {members!r}")
        _ce_names(members, f"groups.{gname}")
    parser = _Parser(text, groups, known)
    node = parser.parse()
    unused = set(groups or {}) - parser.used_groups
    if unused:
        raise RuleSyntaxError(f"groups defined but not used by the condition: {', '.join(sorted(unused))}")
    return node


# -------------------------------------------------------------------------------------------- Rule
@dataclass(frozen=True)
class Rule:
    """A named predicate over cognitive elements, with what to do when it fires.

    ``evaluate(fired)`` decides the rule on the set of CEs detected in a conversation; ``score(scores)``
    is its continuous score from per-CE scores (the min/max composition); ``ces`` lists every CE the rule
    mentions (condition and supporting), ``condition_ces`` only those of the condition.
    """

    condition: Node
    name: str = "rule"
    description: str = ""
    action: str = "flag"
    message: str | None = None  #: the text emitted by ``replace``
    system_prompt: str | None = None  #: the system prompt ``redirect`` switches to
    supporting: tuple[str, ...] = ()
    text: str = ""
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()  #: named groups the condition text refers to

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"rule {self.name!r}: action must be one of {', '.join(ACTIONS)}, got {self.action!r}")
        if self.action == "replace" and not self.message:
            raise ValueError(f"rule {self.name!r}: action 'replace' needs a 'message'")
        if self.action == "redirect" and not self.system_prompt:
            raise ValueError(f"rule {self.name!r}: action 'redirect' needs a 'system_prompt'")

    @property
    def condition_ces(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c for s in _selectors(self.condition) for c in s.ces))

    @property
    def ces(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.condition_ces + tuple(self.supporting)))

    @property
    def required(self) -> tuple[str, ...]:
        """CEs every satisfying assignment needs (members of ``all of`` groups on every ``or`` branch);
        with the JSON form these are ``all_required``. Used as positives in calibration."""
        def req(node: Node) -> set[str]:
            if isinstance(node, Selector):
                return set(node.ces) if node.need == len(node.ces) else set()
            sets = [req(i) for i in node.items]
            return set().union(*sets) if isinstance(node, And) else set.intersection(*sets)
        r = req(self.condition)
        return tuple(c for c in self.condition_ces if c in r)

    def evaluate(self, fired: Iterable[str]) -> bool:
        """True when the CEs in ``fired`` satisfy the condition."""
        if isinstance(fired, str):
            raise TypeError("fired must be a collection of CE names, not a string")
        return self.condition.evaluate(frozenset(fired))

    def score(self, scores: Mapping[str, float]) -> float:
        """Continuous rule score from per-CE scores (every CE of the condition must have one)."""
        missing = [c for c in self.condition_ces if c not in scores]
        if missing:
            raise ValueError(f"rule {self.name!r}: no score for CE(s) {', '.join(missing)}")
        return float(self.condition.score(scores))

    def render(self) -> str:
        return self.condition.render()

    def check_ces(self, known: Iterable[str]) -> "Rule":
        """Raise a ValueError naming the CEs of this rule that are not in ``known``."""
        known = set(known)
        missing = [c for c in self.ces if c not in known]
        if missing:
            raise ValueError(f"rule {self.name!r} uses unknown CE(s) {', '.join(missing)}; "
                             f"known: {', '.join(sorted(known))}")
        return self

    def to_dict(self) -> dict:
        d = {"name": self.name, "description": self.description, "condition": self.text or self.render(),
             "action": self.action}
        for k in ("message", "system_prompt"):
            if getattr(self, k):
                d[k] = getattr(self, k)
        if self.supporting:
            d["supporting"] = list(self.supporting)
        if self.groups:
            d["groups"] = {g: list(m) for g, m in self.groups}
        return d


def parse_rule(text: str, known_ces: Iterable[str] | None = None, *, name: str = "rule", description: str = "",
               action: str = "flag", groups: Mapping[str, Sequence[str]] | None = None,
               supporting: Sequence[str] = (), message: str | None = None,
               system_prompt: str | None = None) -> Rule:
    """Parse ``text`` (the grammar of the module docstring) into a :class:`Rule`.

    ``known_ces`` (optional) is the CE library: a CE outside it is an error. Raises :class:`RuleSyntaxError`
    (a ``ValueError``) with line and column for malformed text.
    """
    if known_ces is not None:
        known_ces = _ce_names(known_ces, "known_ces", iterable=True)
    node = parse_condition(text, groups=groups, known_ces=known_ces)
    sup = tuple(dict.fromkeys(_ce_names(supporting, "supporting")))
    if known_ces is not None:
        known = set(known_ces)  # once: rebuilding it per supporting CE was quadratic
        bad = [c for c in sup if c not in known]
        if bad:
            raise ValueError(f"rule {name!r}: unknown supporting CE(s) {', '.join(bad)}")
    return Rule(node, name=name, description=description, action=action, supporting=sup, text=text,
                message=message, system_prompt=system_prompt,
                groups=tuple((g, tuple(m)) for g, m in (groups or {}).items()))


def rule_from_json(obj: Mapping | str, known_ces: Iterable[str] | None = None, **kwargs) -> Rule:
    """A rule from the paper repository's JSON form (``all_required``, ``any_of``, ``supporting``)."""
    if isinstance(obj, str):
        obj = _parse_json(obj, "JSON rule")
    if not isinstance(obj, Mapping):
        raise RuleSyntaxError("a JSON rule must be an object with 'all_required', 'any_of' and/or 'supporting'")
    extra = set(obj) - {"all_required", "any_of", "supporting", "name", "description", "action", "message",
                        "system_prompt"}
    if extra:
        raise RuleSyntaxError(f"unknown JSON rule field(s): {', '.join(sorted(map(str, extra)))}")

    def listed(key: str) -> list:
        value = obj.get(key)
        return [] if value is None else value

    req = list(dict.fromkeys(_ce_names(listed("all_required"), "all_required")))  # 'all of': a repeat changes nothing
    any_of = listed("any_of")
    if isinstance(any_of, str):
        _ce_names(any_of, "any_of")  # raises: a string is not a list of groups
    if not isinstance(any_of, (list, tuple)):
        raise RuleSyntaxError(f"'any_of' must be a list of groups (lists of CE names), got {type(any_of).__name__}")
    if any_of and all(isinstance(x, str) for x in any_of):  # one group written flat
        any_of = [any_of]
    groups = [list(dict.fromkeys(_ce_names(g, f"any_of[{i}]"))) for i, g in enumerate(any_of)]  # '1 of': same
    parts = []
    if req:
        parts.append("all of {" + ", ".join(req) + "}")
    for g in groups:
        if not g:
            raise RuleSyntaxError("empty group in 'any_of'")
        parts.append("1 of {" + ", ".join(g) + "}")
    if not parts:
        raise RuleSyntaxError("a JSON rule needs 'all_required' or 'any_of': a rule with neither would fire on "
                              "every dialogue in the official library (empty requirements are met vacuously); "
                              "refused here, since supporting CEs alone say nothing about misuse")
    opts = {k: obj[k] for k in ("name", "description", "action", "message", "system_prompt") if k in obj}
    opts.update(kwargs)
    return parse_rule(" and ".join(parts), known_ces, supporting=listed("supporting"), **opts)


def _parse_json(text: str, where: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RuleSyntaxError(f"{where}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise RuleSyntaxError(f"{where}: JSON nested too deeply") from None


# --------------------------------------------------------------------------------------- rule files
@dataclass
class RuleSet:
    """Several named rules (a rule file). Iterable; ``ruleset["name"]`` looks one up."""

    rules: list[Rule] = field(default_factory=list)

    def __post_init__(self) -> None:
        dup = _repeated([r.name for r in self.rules])
        if dup:
            raise ValueError(f"duplicate rule name(s): {', '.join(dup)}")

    def __iter__(self):
        return iter(self.rules)

    def to_frame(self):
        """One row per rule: name, condition, action, the CEs it reads and its description."""
        import pandas as pd

        return pd.DataFrame([{"rule": r.name, "condition": r.text or str(r.condition), "action": r.action,
                              "ces": ", ".join(sorted(r.ces)), "description": r.description} for r in self.rules])

    def _repr_html_(self) -> str:
        """In Jupyter: the rules as a table."""
        return f"<div><b>RuleSet</b> ({len(self.rules)} rules){self.to_frame().to_html(index=False)}</div>"

    def __len__(self) -> int:
        return len(self.rules)

    def __getitem__(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(f"no rule named {name!r}; rules: {', '.join(r.name for r in self.rules)}")

    @property
    def ces(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c for r in self.rules for c in r.ces))

    def to_dict(self) -> dict:
        return {"schema_version": 1, "rules": [r.to_dict() for r in self.rules]}

    def save(self, path: str | Path) -> Path:
        from interp.io import atomic_write_json
        return atomic_write_json(path, self.to_dict())


def _rule_entry(entry: Mapping, known: Iterable[str] | None, where: str) -> Rule:
    if not isinstance(entry, Mapping):
        raise RuleSyntaxError(f"{where}: each rule must be a mapping, got {type(entry).__name__}")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RuleSyntaxError(f"{where}: rule 'name' must match [A-Za-z_][A-Za-z0-9_]*, got {name!r}")
    try:
        for key in ("description", "definition", "message", "system_prompt", "action"):
            if entry.get(key) is not None and not isinstance(entry[key], str):
                raise RuleSyntaxError(f"{key!r} must be a string, got {type(entry[key]).__name__} {entry[key]!r}")
        opts = dict(name=name, description=entry.get("description") or entry.get("definition") or "",
                    action=entry.get("action") or "flag", message=entry.get("message"),
                    system_prompt=entry.get("system_prompt"))
        if "condition" in entry:
            if not isinstance(entry["condition"], str):
                raise RuleSyntaxError(f"'condition' must be a string, got {type(entry['condition']).__name__} "
                                      f"{entry['condition']!r}")
            sup = entry.get("supporting")
            return parse_rule(entry["condition"], known, groups=entry.get("groups"),
                              supporting=[] if sup is None else sup, **opts)
        return rule_from_json({k: entry[k] for k in ("all_required", "any_of", "supporting") if k in entry},
                              known, **opts)
    except RuleSyntaxError as e:
        err = RuleSyntaxError(f"{where}, rule {name!r}: {e}")
        err.line, err.column, err.text = e.line, e.column, e.text
        raise err from None
    except ValueError as e:  # the rule's own checks (action, message, unknown CEs)
        raise RuleSyntaxError(f"{where}: {e}") from None


def load_rules(source: str | Path | Mapping | Sequence, known_ces: Iterable[str] | None = None) -> RuleSet:
    """Read a rule file (JSON or YAML, read safely) or an already-parsed mapping/list.

    A malformed file or entry raises :class:`RuleSyntaxError` (a ``ValueError``) naming the file, the rule
    and the field (a string where a list of CEs is required, a non-string CE name, a non-string condition,
    bad YAML or JSON ...); a missing file raises ``FileNotFoundError``.

    Format: ``{"rules": [{"name", "description", "condition" | JSON form, "groups"?, "supporting"?,
    "action"?, "message"?, "system_prompt"?}, ...]}`` or a bare list of such entries; a single
    ``gavel-rules`` ``rule.yaml`` (one mapping with ``name`` and ``condition``) is read as a one-rule set.
    """
    where = "rules"
    if isinstance(source, (str, Path)) and not (isinstance(source, str) and source.lstrip().startswith(("{", "["))):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"rule file {path} does not exist")
        where = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise RuleSyntaxError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        if path.suffix.lower() in (".yaml", ".yml"):
            data = _parse_yaml(text, path)
        else:
            data = _parse_json(text, str(path))
    elif isinstance(source, str):
        data = _parse_json(source, "rules")
    else:
        data = source
    if isinstance(data, Mapping) and "rules" in data:
        entries = data["rules"]
        if not isinstance(entries, (list, tuple)):
            raise RuleSyntaxError(f"{where}: 'rules' must be a list of rule mappings, got {type(entries).__name__}")
    elif isinstance(data, Mapping) and "name" in data:
        entries = [data]
    elif isinstance(data, (list, tuple)):
        entries = data
    else:
        raise RuleSyntaxError(f"{where}: expected a mapping with 'rules', one rule mapping, or a list of rules, "
                              f"got {type(data).__name__}")
    if known_ces is not None:  # once (an iterator would be used up by the first rule)
        known_ces = _ce_names(known_ces, "known_ces", iterable=True)
    rules = [_rule_entry(e, known_ces, f"{where}[{i}]") for i, e in enumerate(entries)]
    try:
        return RuleSet(rules)
    except ValueError as e:
        raise RuleSyntaxError(f"{where}: {e}") from None


def _parse_yaml(text: str, path: Path):
    """YAML read safely; a malformed file raises :class:`RuleSyntaxError` naming the file, line and column."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise RuleSyntaxError(f"{path}: not valid YAML{at}: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise RuleSyntaxError(f"{path}: not valid YAML: {e}") from None
    except RecursionError:
        raise RuleSyntaxError(f"{path}: YAML nested too deeply") from None
