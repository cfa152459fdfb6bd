"""Cognitive elements as named, versioned folders, CE data by elicitation (ERI), and a CE library on disk.

A :class:`CE` holds its name, version, description, training texts (prefilled assistant turns) and
calibration dialogues (multi-turn, with the CEs each shows). A :class:`CELibrary` is a folder::

    library/
      ces/<name>/ce.json          # name, version, description, texts, calibration, θ, patience
      detector/detector.safetensors, detector.json

(the detector is one multi-label network over the library's CEs, as in the paper, so its weights live
once at the library level; each CE folder carries its own calibrated θ and patience).

ERI (digest §2): the model is asked to rewrite texts "in the manner of ⟨CE⟩" and the readouts of the
*generated* tokens are the CE's training data. The exact prompt is not published (UNCERTAIN); the default
here is ``"Rewrite the following text in the manner of {ce}:\\n\\n{text}"`` with ``{ce}`` the CE's name with
spaces, settable through ``template``.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from interp.io import SerializationError, load_json, output_dir, save_tensors_json
from interp.progress import progress

from .detector import CEDetector
from .features import FeatureSpec
from .monitor import render_prompt

__all__ = ["CE", "CELibrary", "elicit", "ERI_TEMPLATE"]

ERI_TEMPLATE = "Rewrite the following text in the manner of {ce}:\n\n{text}"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class CE:
    """One cognitive element: what it means and the data its detector is trained and calibrated on."""

    name: str
    description: str = ""
    version: int = 1
    texts: list[str] = field(default_factory=list)  #: training texts (assistant turns showing the CE)
    calibration: list[dict] = field(default_factory=list)  #: {"messages": [...], "ces": [...]} dialogues

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(f"CE.name must match [A-Za-z_][A-Za-z0-9_]*, got {self.name!r}")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 1:
            raise ValueError(f"CE.version must be a positive integer, got {self.version!r}")
        if not isinstance(self.description, str):
            raise ValueError(f"CE.description must be a string, got {self.description!r}")
        # a string where a list belongs would be iterated as characters
        if not isinstance(self.texts, (list, tuple)) or not all(isinstance(t, str) for t in self.texts):
            raise ValueError(f"CE.texts must be a list of strings, got {type(self.texts).__name__}")
        if not isinstance(self.calibration, (list, tuple)):
            raise ValueError(f"CE.calibration must be a list of dialogues, got {type(self.calibration).__name__}")
        for i, d in enumerate(self.calibration):
            if not isinstance(d, dict) or "messages" not in d or "ces" not in d:
                raise ValueError(f"CE.calibration[{i}] must be a dict with 'messages' and 'ces'")
            if not isinstance(d["ces"], (list, tuple)) or not all(isinstance(c, str) for c in d["ces"]):
                raise ValueError(f"CE.calibration[{i}]['ces'] must be a list of CE names, got {d['ces']!r}")
            if not isinstance(d["messages"], (list, tuple)):
                raise ValueError(f"CE.calibration[{i}]['messages'] must be a list of messages, got "
                                 f"{type(d['messages']).__name__}")

    def save(self, folder: str | Path, thresholds: dict | None = None, overwrite: bool = False) -> Path:
        with output_dir(folder, overwrite=overwrite, writer="CE.save") as tmp:
            save_tensors_json(tmp, {}, {"schema_version": 1, **asdict(self), "calibrated": thresholds or {}},
                              stem="ce")
        return Path(folder)

    @classmethod
    def load(cls, folder: str | Path) -> "CE":
        keys = ("name", "description", "version", "texts", "calibration")
        meta = load_json(Path(folder) / "ce.json", what="cognitive element", required=keys)
        try:
            return cls(**{k: meta[k] for k in keys})
        except ValueError as exc:
            raise SerializationError(f"{Path(folder) / 'ce.json'}: {exc}") from None


class CELibrary:
    """CEs plus the detector trained on them."""

    def __init__(self, ces: Sequence[CE], detector: CEDetector | None = None):
        self.ces = list(ces)
        names = [c.name for c in self.ces]
        if len(set(names)) != len(names):
            raise ValueError("CE names in a library must be unique")
        if detector is not None and detector.ces != names:
            raise ValueError(f"the detector's CEs {detector.ces} differ from the library's {names}")
        self.detector = detector

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.ces]

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        det = self.detector
        for c in self.ces:
            cal = None
            if det is not None:
                i = det.index(c.name)
                cal = {"threshold": float(det.thresholds[i]), "patience": int(det.patience[i])}
            c.save(path / "ces" / c.name, cal, overwrite=overwrite)
        if det is not None:
            det.save(path / "detector", overwrite=overwrite)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "CELibrary":
        path = Path(path)
        if not (path / "ces").is_dir():
            raise FileNotFoundError(f"{path} holds no CE library (missing ces/)")
        det = CEDetector.load(path / "detector") if (path / "detector" / "detector.json").is_file() else None
        by_name = {c.name: c for c in (CE.load(f) for f in sorted((path / "ces").iterdir()) if (f / "ce.json").is_file())}
        order = det.ces if det is not None else sorted(by_name)
        missing = [n for n in order if n not in by_name]
        if missing:
            raise SerializationError(f"{path}: the detector knows CE(s) {missing} that have no ces/<name>/ce.json")
        return cls([by_name[n] for n in order], det)


@torch.no_grad()
def elicit(model, ce: str | CE, texts: Sequence[str] | None = None, spec: FeatureSpec | None = None,
           max_new_tokens: int = 64,
           template: str = ERI_TEMPLATE, batch_size: int = 8, **generate_kwargs) -> tuple[list[str], list[torch.Tensor]]:
    """ERI: have the model rewrite each text in the manner of ``ce``; return the generated texts and the
    readout features ``[T_i, width]`` of the generated tokens (each read in the pass that feeds it back; the
    last token of a row is never fed back, and tokens after end-of-sequence are dropped).

    Defaults: ``texts=None`` rewrites the built-in CE-free sentences (:data:`.library.NEUTRAL`, slots filled
    with a fixed seed); ``spec=None``
    reads the paper's layer range mapped to the model (:meth:`FeatureSpec.official`). ``ce`` has no default:
    it names the cognitive element to elicit."""
    name = ce.name if isinstance(ce, CE) else str(ce)
    if texts is None:
        import random

        from .library import NEUTRAL, _fill
        rng = random.Random("gavel/elicit")
        texts = [_fill(rng, t) for t in NEUTRAL]
    if not texts:
        raise ValueError("elicit needs at least one text")
    from .features import default_spec
    spec = default_spec(model, spec)
    spec.check(model)
    names = spec.names()
    eos = getattr(model.tokenizer, "eos_token_id", None)
    out_text: list[str] = []
    out_feats: list[torch.Tensor] = []
    for start in progress(range(0, len(texts), batch_size), desc=f"ERI {name}"):
        chunk = texts[start:start + batch_size]
        prompts = [render_prompt(model, [{"role": "user", "content": template.format(ce=name.replace("_", " "),
                                                                                       text=t)}]) for t in chunk]
        with model.capture(names) as cache:
            ids = model.generate(prompts, max_new_tokens=max_new_tokens, return_text=False, **generate_kwargs)
        passes = [cache.passes(n)[1:] for n in names]  # pass k reads new token k: [B, 1, H, d] each
        if passes[0]:
            z = torch.stack([torch.cat(p, 1) for p in passes], 2).float()  # [B, P, L, H, d]
            if spec.group_kv:
                H, d = z.shape[-2:]
                kv = model.cfg.n_kv_heads
                z = z.reshape(*z.shape[:3], kv, H // kv, d).mean(-2)
            z = z.flatten(2)
        for i, row in enumerate(ids):
            valid = row >= 0
            if eos is not None:
                valid &= row != eos
            n = int(valid.sum())
            out_text.append(model.tokenizer.decode(row[valid], skip_special_tokens=True))
            # passes that exist for this row: tokens 1..min(n, P) excluding the never-read last token
            k = min(n, len(passes[0])) if passes[0] else 0
            out_feats.append(z[i, :k].cpu() if k else torch.zeros(0, spec.width(model)))
    return out_text, out_feats
