"""Run audit checks on a model and collect an :class:`~interp.apps.audit.report.AuditReport`."""
from __future__ import annotations

import dataclasses
import time
import traceback
from pathlib import Path
from typing import Any, Mapping, Sequence

from interp.model import Model
from interp.progress import progress

from interp.checks import AuditData, SkipCheck, configure, is_config
from .registry import get_check
from .report import AuditReport, CheckRecord, prepare_output


def _first_line(exc: BaseException) -> str:
    """``"Type: first line of the message"``: an error's reason on one console line."""
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0]}" if msg and msg[0] else type(exc).__name__


def _metrics(check: Any, result: Any) -> dict[str, Any]:
    """The check's headline metrics, every declared name present (``None`` where not measured)."""
    declared = dict(getattr(check, "METRICS", {}) or {})
    got = dict(check.metrics(result)) if callable(getattr(check, "metrics", None)) else {}
    out = {k: got.get(k) for k in declared}
    out.update({k: v for k, v in got.items() if k not in out})
    return {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v) for k, v in out.items()}


def model_card(model: Model, spec: str | None = None) -> dict[str, Any]:
    """Shape facts, parameter count, dtype and device of a wrapped model."""
    cfg = model.cfg
    module = getattr(model, "hf_model", None) or getattr(model, "tl", None)
    n_params = dtype = None
    if module is not None:
        params = list(module.parameters())
        n_params = int(sum(p.numel() for p in params))
        dtype = str(params[0].dtype).replace("torch.", "") if params else None
    return {"spec": spec or str(getattr(model, "source", "") or cfg.family), "backend": model.backend,
            "family": cfg.family, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
            "d_model": cfg.d_model, "d_head": cfg.d_head, "d_vocab": cfg.d_vocab, "n_params": n_params,
            "dtype": dtype, "device": str(model.device)}


def _count_tokens(model: Model, texts: Sequence[str]) -> int | None:
    if model.tokenizer is None:
        return None
    try:
        return int(sum(len(model.tokenizer(t)["input_ids"]) for t in texts))
    except Exception:  # noqa: BLE001 - informative only
        return None


def run_audit(model: Model, checks: Sequence[str | Any], data: AuditData | None = None,
              out: str | Path | None = None, options: Mapping[str, Mapping[str, str]] | None = None,
              spec: str | None = None, timings: Mapping[str, float] | None = None,
              keep_going: bool = True, thresholds: Sequence[Any] = (), step: int | None = None) -> AuditReport:
    """Run ``checks`` (names or check instances) on ``model`` and ``data``; write the report to ``out``.

    ``options`` maps a check name to string overrides of its config fields, or to its config already built
    (:func:`interp.checks.configure`; the CLI parses ``--set`` once into these). A check that does not apply
    (its ``missing()`` or ``applies(model)`` gives a reason, its ``run`` raises :class:`~interp.checks.SkipCheck`
    or returns a result with ``applicable`` false) is recorded as ``status="skipped"`` with the reason; a check
    that raises is recorded as ``status="error"`` with its traceback (``keep_going=False`` re-raises instead).
    ``thresholds`` (:class:`~interp.apps.audit.gate.Threshold`) are evaluated on the checks' metrics; ``step`` is
    the checkpoint's training step for the provenance (default: read from the checkpoint). The output folder
    is validated before anything runs and written atomically at the end.
    """
    t_start = time.perf_counter()
    if out is not None:
        prepare_output(out)
    data = data or AuditData.builtin()
    options = dict(options or {})
    instances = []
    for c in checks:
        if isinstance(c, str):
            cls = get_check(c)
            given = options.get(c, {})
            # a config built already (the CLI parses --set once, before any model loads) is used as it is
            instances.append(cls(given if is_config(given) else configure(cls, dict(given))))
        else:
            instances.append(c)
    unknown_opts = set(options) - {getattr(i, "name", "") for i in instances}
    if unknown_opts:
        raise ValueError(f"options given for checks that are not selected: {', '.join(sorted(unknown_opts))}")
    records: list[CheckRecord] = []
    all_timings = dict(timings or {})
    for check in progress(instances, desc="audit", total=len(instances), leave=True):
        name = getattr(check, "name", type(check).__name__)
        cfg = getattr(check, "config", None)
        cfg_dict = dataclasses.asdict(cfg) if cfg is not None and dataclasses.is_dataclass(cfg) else {}
        t0 = time.perf_counter()
        desc = getattr(check, "description", "")
        try:
            why = (check.missing() if callable(getattr(check, "missing", None)) else None) or \
                (check.applies(model) if callable(getattr(check, "applies", None)) else None)
            if why:
                raise SkipCheck(why)
            result = check.run(model, data)
            rendered = check.render(result)
            summary = dict(check.summary(result)) if hasattr(check, "summary") else {}
            payload = check.to_json(result) if hasattr(check, "to_json") else result.to_dict()
            skipped = getattr(result, "applicable", True) is False
            rec = CheckRecord(name, getattr(check, "title", name), "skipped" if skipped else "ok",
                              time.perf_counter() - t0, cfg_dict, summary, payload, None, result, rendered, desc,
                              reason=str(getattr(result, "reason", "") or "the check does not apply") if skipped
                              else None, metrics=_metrics(check, result) if not skipped else
                              {k: None for k in getattr(check, "METRICS", {})})
        except SkipCheck as exc:
            rec = CheckRecord(name, getattr(check, "title", name), "skipped", time.perf_counter() - t0, cfg_dict,
                              description=desc, reason=str(exc) or "the check does not apply",
                              metrics={k: None for k in getattr(check, "METRICS", {})})
        except Exception as exc:  # noqa: BLE001 - recorded in the report
            if not keep_going:
                raise
            rec = CheckRecord(name, getattr(check, "title", name), "error", time.perf_counter() - t0, cfg_dict,
                              error=f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}",
                              description=desc, reason=_first_line(exc),
                              metrics={k: None for k in getattr(check, "METRICS", {})})
        records.append(rec)
        all_timings[f"check:{name}"] = rec.seconds
    from .provenance import provenance

    digest = data.digest()
    prov = provenance(model, spec, digest, step)
    all_timings["total"] = all_timings.get("load_model", 0.0) + (time.perf_counter() - t_start)
    report = AuditReport(model_card(model, spec),
                         {"source": data.source, "n_texts": len(data.texts), "n_tokens": _count_tokens(model, data.texts),
                          "hash": digest}, records, all_timings, provenance=prov)
    report.evaluate(thresholds)
    if out is not None:
        report.write(out)
    return report


__all__ = ["run_audit", "model_card"]
