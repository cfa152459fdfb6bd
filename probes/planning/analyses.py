"""The paper's three analyses over VQ-VAE codes of hidden-state sets (digest §4).

* :func:`horizon_curve` -- ``nMI(Z_H; Z_{T+τ}^L)`` over ``τ``: how far ahead the prefix computation ``H``
  (all prompt positions, all layers but the last) informs the last-layer states of later tokens.
* :func:`branch_awareness` -- ``I(Z_H; Z_alt) / I(Z_H; Z_decoy)``: does ``H`` carry the correct path the
  model did *not* generate (greedy) more than a decoy path of the same graph; with a shuffled-decoy control.
* :func:`block_layer_map` -- position-block x layer maps of ``nMI(B_k^l; Z_T^L)``, ``nMI(B_k^l; Z_{T+1}^L)``
  and the conditional ``nMI(B_k^l; Z_T^L | Z_T^l)``, on a task or on plain texts.

Each takes ``(model, task_or_texts, config)`` and works with any :class:`interp.Model` (capture through
``blocks.{l}.hook_resid_post`` by default) and any task object with ``examples(n, seed)`` returning items
with ``prompt``/``target`` (and ``answers``/``decoy`` for branches) and ``is_correct(example, generated)``
(the :class:`~interp.probes.planning.tasks.PlanningTask` protocol). Every MI is reported raw, with its
shuffled-pairing null (mean and spread over permutations) and null-corrected; nMI is the corrected MI
divided by the largest corrected MI of the same analysis (the paper's relative normalisation).

Choices where the paper is UNCERTAIN (see also docs/planning.md):

* which continuation ``Z_{T+τ}`` codes: ``continuation="sample"`` (default: temperature-1 samples from the
  model, so a token that the task leaves random is random, not the greedy argmax, which is a deterministic
  function of the prefix); ``"greedy"`` and ``"target"`` (teacher-forced reference) are options;
* ``τ = 0`` is the last prompt position ``T`` itself (its last-layer state decides the first new token);
* one VQ-VAE per set type: ``H``; the last-layer single states of all ``τ`` pooled; paths (alternative and
  decoy pooled); per layer, the blocks of that layer (all ``k`` pooled); single states of all layers pooled;
* paths are coded from the model's last-layer states of the path tokens read *alone* (``<bos>`` + path;
  ``path_context="alone"``, so ``Z_path`` depends on the path only), or after the prompt (``"prompt"``);
* the shuffled-decoy control swaps the alternative and decoy paths of a random half of the examples; both
  arms of the control ratio are then the same mixture, so it should be near 1;
* blocks ``B_k`` hold ``block_size`` positions ending right before ``T`` (``k = 1`` most recent); ``k = 0``
  denotes the single state at ``T``; the block size (15 in the paper's notation) defaults to 8 here.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, fields
from typing import Any, Sequence

import numpy as np
import torch

from interp.model import Model
from interp.progress import progress
from interp.results import Result

from .mi import conditional_mutual_information, mutual_information, shuffled_null
from .states import SetSpec, StateSets, final_layer, harvest_sets, prefix_layers
from .vqvae import TrainConfig, VQVAEConfig, train_vqvae

__all__ = ["CodeConfig", "HorizonConfig", "BranchConfig", "BlockMapConfig", "HorizonResult", "BranchResult",
           "BlockMapResult", "horizon_curve", "branch_awareness", "block_layer_map", "block_map_from_sets", "fit_codes",
           "mi_with_null"]


# ----------------------------------------------------------------------------------------- configuration
@dataclass
class CodeConfig:
    """Shared settings: data size, VQ-VAE size and training, null permutations, capture hook."""

    n_examples: int = 2000
    seed: int = 0
    n_codes: int = 32
    vqvae: dict = field(default_factory=dict)     # extra VQVAEConfig fields (d_model, d_latent, ...)
    train: dict = field(default_factory=lambda: {"steps": 1500})  # TrainConfig fields
    n_seeds: int = 1                              # VQ-VAE seeds (results: mean and spread over them)
    n_perm: int = 20                              # permutations of the shuffled-pairing null
    hook: str = "hook_resid_post"
    batch_size: int = 64                          # model batch size (harvest, generation)
    layers: tuple[int, ...] | None = None         # layers of H (default: all but the last)


@dataclass
class HorizonConfig(CodeConfig):
    max_tau: int = 10
    continuation: str = "sample"                  # "sample" | "greedy" | "target"
    temperature: float = 1.0


@dataclass
class BranchConfig(CodeConfig):
    path_context: str = "alone"                   # "alone" | "prompt"
    path_layers: tuple[int, ...] | None = None    # layers coding a path (default: the last)
    #: "greedy" (the paper's: the model's own solved continuations) or "target" (every example, with its
    #: reference answer as the generated path: for a model that does not solve the task yet)
    continuation: str = "greedy"


@dataclass
class BlockMapConfig(CodeConfig):
    block_size: int = 8
    n_blocks: int = 4
    map_layers: tuple[int, ...] | None = None     # layers of the map (default: all)
    anchors_per_text: int = 4                     # plain texts: random anchors T per text
    max_tokens: int = 128                         # plain texts: truncate to this many tokens


# ----------------------------------------------------------------------------------------- helpers
def mi_with_null(a, b, c=None, n_perm: int = 20, seed: int = 0) -> tuple[float, float, float]:
    """``(mi, null_mean, null_std)`` in nats: ``I(A;B)`` or ``I(A;B|C)`` and its shuffled-pairing null."""
    mi = mutual_information(a, b) if c is None else conditional_mutual_information(a, b, c)
    mean, std = shuffled_null(a, b, n_perm=n_perm, seed=seed, c=c)
    return mi, mean, std


def fit_codes(groups: dict[str, dict[str, StateSets]], config: CodeConfig, seed: int = 0
              ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict]]:
    """Train one VQ-VAE per *type* and encode every cell of that type.

    ``groups``: type name -> {cell name -> StateSets}; the type's VQ-VAE is trained on all its cells pooled.
    Returns ``(codes, summaries)``: type -> cell -> codes ``[N_cell]``, and type -> training summary
    (codes used, relative reconstruction error, steps)."""
    codes: dict[str, dict[str, np.ndarray]] = {}
    summary: dict[str, dict] = {}
    train = dict(config.train)
    train["seed"] = int(train.get("seed", 0)) + seed
    for t, cells in groups.items():
        pooled = StateSets.cat(list(cells.values()))
        vq = {"n_codes": config.n_codes, **config.vqvae}
        model, hist = train_vqvae(pooled, VQVAEConfig(d_in=pooled.d, **vq), TrainConfig(**{**train, "desc": f"VQ-VAE {t}"}))
        codes[t] = {name: model.encode(s).numpy() for name, s in cells.items()}
        summary[t] = {"codes_used": hist["codes_used"], "val_rel_error": hist["val_rel_error"],
                      "steps": hist["stopped_at"], "n_sets": len(pooled)}
    return codes, summary


def _prompt_ids(model: Model, prompts: Sequence[str], batch_size: int) -> list[torch.Tensor]:
    out = []
    for b in model.batches(list(prompts), batch_size, padding_side="right"):
        for ids, m in zip(b["input_ids"], b["attention_mask"]):
            out.append(ids[m.bool()].cpu())
    return out


def _text_ids(model: Model, texts: Sequence[str]) -> list[torch.Tensor]:
    """Token ids of continuations (no special tokens), one tensor per text."""
    tok = model.tokenizer
    return [torch.tensor(tok(t, add_special_tokens=False)["input_ids"], dtype=torch.long) for t in texts]


def _generate(model: Model, prompts: Sequence[str], n_new: int, do_sample: bool, temperature: float, seed: int,
              batch_size: int) -> list[torch.Tensor]:
    out = []
    for i in progress(range(0, len(prompts), batch_size), desc="generate"):
        new = model.generate(list(prompts[i:i + batch_size]), max_new_tokens=n_new, do_sample=do_sample,
                             temperature=temperature, seed=seed + i, return_text=False, stop_at_eos=False)
        out.extend(row.cpu() for row in new)
    return out


def _decode(model: Model, ids: torch.Tensor) -> str:
    ids = ids[ids >= 0]
    return model.tokenizer.decode(ids.tolist(), skip_special_tokens=True)


def _layers_of_h(model: Model, config: CodeConfig) -> list[int]:
    return list(config.layers) if config.layers is not None else prefix_layers(model)


def _stats(values: list[float]) -> tuple[float, float]:
    """Mean and spread (ddof=1; 0 for one value, NaN when a value is infinite)."""
    v = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        return float(v.mean()), float("nan")
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def _config_dict(config: Any) -> dict:
    return {f.name: (list(v) if isinstance(v := getattr(config, f.name), tuple) else v) for f in fields(config)}


# ----------------------------------------------------------------------------------------- horizon
@dataclass
class HorizonResult(Result):
    """``nMI(Z_H; Z_{T+τ}^L)`` over ``τ`` (nats; arrays ``[n_tau]``, mean over VQ-VAE seeds).

    ``corrected = mi - null_mean``; ``nmi = corrected / max(corrected)``; ``null_std`` is the spread of the
    shuffled null, ``seed_std`` the spread of ``corrected`` over VQ-VAE seeds."""

    task: str
    taus: list
    mi: np.ndarray
    null_mean: np.ndarray
    null_std: np.ndarray
    corrected: np.ndarray
    nmi: np.ndarray
    seed_std: np.ndarray
    accuracy: float
    n: int
    n_codes: int
    config: dict
    vqvae: dict
    codes: dict = field(default_factory=dict)          # cell -> codes [n] of the first VQ-VAE seed ("H", "tau0", ...)
    example_index: np.ndarray | None = None            # which of task.examples(n_examples, seed) were used [n]

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame({"task": self.task, "tau": self.taus, "mi": self.mi, "null_mean": self.null_mean,
                             "null_std": self.null_std, "corrected": self.corrected, "nmi": self.nmi,
                             "seed_std": self.seed_std})

    def figure(self):
        import plotly.graph_objects as go

        scale = float(np.max(self.corrected)) if np.max(self.corrected) > 0 else 1.0
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=self.taus, y=self.nmi, mode="lines+markers", name=f"{self.task}: nMI",
                                 error_y=dict(type="data", array=np.asarray(self.seed_std) / scale, visible=True)))
        fig.add_trace(go.Scatter(x=self.taus, y=3 * np.asarray(self.null_std) / scale, mode="lines",
                                 line=dict(dash="dot"), name="3 x null std"))
        fig.update_layout(title=f"Horizon: nMI(Z_H; Z_T+τ^L), {self.task} (accuracy {self.accuracy:.2f})",
                          xaxis_title="τ", yaxis_title="null-corrected nMI")
        return fig


def _continuations(model: Model, task, examples, config: HorizonConfig, n_new: int) -> tuple[list, float]:
    prompts = [e.prompt for e in examples]
    if config.continuation == "target":
        conts = [ids[:n_new] for ids in _text_ids(model, [e.target for e in examples])]
        gen = _generate(model, prompts, n_new, False, 1.0, config.seed, config.batch_size)
    elif config.continuation in ("sample", "greedy"):
        gen = _generate(model, prompts, n_new, config.continuation == "sample", config.temperature, config.seed,
                        config.batch_size)
        conts = gen
    else:
        raise ValueError(f"continuation must be 'sample', 'greedy' or 'target', got {config.continuation!r}")
    acc = float(np.mean([bool(task.is_correct(e, _decode(model, g))) for e, g in zip(examples, gen)]))
    return conts, acc


def horizon_curve(model: Model, task=None, config: HorizonConfig | None = None) -> HorizonResult:
    """The horizon analysis on ``task`` (see the module docstring); returns a :class:`HorizonResult`.

    Accuracy is measured on the same continuations when they are generated (``"sample"``/``"greedy"``) and
    on greedy generations for ``"target"``. ``task=None``: the built-in real-text task
    (:class:`~.tasks.TextContinuation`: 24-word KJV prompts).

    Cost: the ``H`` VQ-VAE sees every prompt position at every layer but the last; on SmolLM2-135M (~870
    states per set) one training step on 128 sets costs ~21 CPU-seconds (``benchmarks/speed/planning.py``), so the
    default 1,500 steps are hours on CPU: use ``train={"device": "cuda"}``, fewer ``layers`` or a smaller
    ``train`` budget there."""
    config = config or HorizonConfig()
    if task is None:
        from .tasks import TextContinuation
        task = TextContinuation()
    examples = task.examples(config.n_examples, seed=config.seed)
    prompt_ids = _prompt_ids(model, [e.prompt for e in examples], config.batch_size)
    n_target = max(len(e.target.split()) for e in examples)
    n_new = max(config.max_tau, n_target)
    conts, acc = _continuations(model, task, examples, config, n_new)
    seqs, anchors, keep = [], [], []
    for i, (p, c) in enumerate(zip(prompt_ids, conts)):
        c = c[c >= 0][:config.max_tau]
        if len(c) < config.max_tau:
            continue
        seqs.append(torch.cat([p, c]))
        anchors.append((len(seqs) - 1, len(p) - 1))
        keep.append(i)
    if len(seqs) < 10:
        raise ValueError(f"only {len(seqs)} continuations reach max_tau={config.max_tau} tokens")
    L = final_layer(model)
    taus = list(range(0, config.max_tau + 1))
    specs = {"H": SetSpec.prefix(_layers_of_h(model, config))}
    specs.update({f"tau{t}": SetSpec.state(L, t) for t in taus})
    sets = harvest_sets(model, seqs, anchors, specs, hook=config.hook, batch_size=config.batch_size)
    groups = {"H": {"H": sets["H"]}, "last": {f"tau{t}": sets[f"tau{t}"] for t in taus}}
    per_seed = []
    vq_summary: dict = {}
    first: dict = {}
    for s in range(config.n_seeds):
        codes, summ = fit_codes(groups, config, seed=s)
        vq_summary[f"seed{s}"] = summ
        if s == 0:
            first = {"H": codes["H"]["H"], **codes["last"]}
        zh = codes["H"]["H"]
        per_seed.append([mi_with_null(zh, codes["last"][f"tau{t}"], n_perm=config.n_perm, seed=s) for t in taus])
    arr = np.asarray(per_seed)  # [seeds, taus, 3]
    mi, null_mean, null_std = arr.mean(0).T
    corr_all = arr[..., 0] - arr[..., 1]
    corrected = corr_all.mean(0)
    seed_std = corr_all.std(0, ddof=1) if config.n_seeds > 1 else np.zeros(len(taus))
    return HorizonResult(task=getattr(task, "name", type(task).__name__), taus=taus, mi=mi, null_mean=null_mean,
                         null_std=null_std, corrected=corrected, nmi=_nmi(corrected), seed_std=seed_std,
                         accuracy=acc, n=len(seqs), n_codes=config.n_codes, config=_config_dict(config),
                         vqvae=vq_summary, codes=first, example_index=np.asarray(keep))


def _nmi(values: np.ndarray) -> np.ndarray:
    from .mi import normalized_mi

    return normalized_mi(values)


# ----------------------------------------------------------------------------------------- branch awareness
@dataclass
class BranchResult(Result):
    """Branch awareness: ``ratio = I(Z_H; Z_alt) / I(Z_H; Z_decoy)`` (raw plug-in MIs, nats, mean over seeds).

    ``ratio_corrected`` uses null-corrected MIs (``inf`` when the decoy's is not above 0);
    ``control_ratio`` is the same ratio after swapping alt and decoy in a random half of the examples
    (should be near 1); ``ratio_std`` the spread over VQ-VAE seeds; ``accuracy`` the greedy path accuracy;
    ``n`` the number of correctly solved examples the MIs use."""

    task: str
    ratio: float
    ratio_std: float
    ratio_corrected: float
    control_ratio: float
    control_ratio_std: float
    mi_alt: float
    mi_decoy: float
    mi_generated: float
    null_alt: float
    null_decoy: float
    null_std: float
    accuracy: float
    n: int
    n_codes: int
    ratios: list
    config: dict
    vqvae: dict
    codes: dict = field(default_factory=dict)          # "H", "alt", "decoy", "generated" -> codes [n] (seed 0)
    example_index: np.ndarray | None = None            # solved examples used [n]

    def to_frame(self):
        import pandas as pd

        rows = [("alt", self.mi_alt, self.null_alt), ("decoy", self.mi_decoy, self.null_decoy),
                ("generated", self.mi_generated, float("nan"))]
        df = pd.DataFrame(rows, columns=["path", "mi", "null_mean"])
        df["corrected"] = df["mi"] - df["null_mean"]
        df["task"] = self.task
        df["ratio"] = self.ratio
        df["control_ratio"] = self.control_ratio
        df["accuracy"] = self.accuracy
        return df

    def figure(self):
        import plotly.graph_objects as go

        fig = go.Figure()
        fig.add_trace(go.Bar(x=["I(Z_H; Z_alt)", "I(Z_H; Z_decoy)", "I(Z_H; Z_generated)"],
                             y=[self.mi_alt, self.mi_decoy, self.mi_generated], name="plug-in MI"))
        fig.add_trace(go.Bar(x=["I(Z_H; Z_alt)", "I(Z_H; Z_decoy)"], y=[self.null_alt, self.null_decoy],
                             name="shuffled null"))
        fig.update_layout(barmode="group", yaxis_title="nats",
                          title=f"Branch awareness, {self.task}: ratio {self.ratio:.2f} ± {self.ratio_std:.2f} "
                                f"(control {self.control_ratio:.2f}), accuracy {self.accuracy:.2f}")
        return fig


def branch_awareness(model: Model, task=None, config: BranchConfig | None = None) -> BranchResult:
    """The branch-awareness analysis on a task whose examples have two (or more) ``answers`` and a ``decoy``.

    The model continues each prompt greedily by as many tokens as the longest answer has; a continuation whose
    first words (or first tokens) are one answer's is *solved* and the first other answer is its alternative; only those
    examples enter the MIs (accuracy = ``task.is_correct`` over all examples). With
    ``config.continuation="target"`` every example enters, its reference ``target`` taken as the generated path and
    the first other answer as the alternative (accuracy is still that of the greedy continuations).

    ``task`` has no default: branching needs a task with two known correct paths and a decoy per prompt, which
    real text does not have (the path-finding task of the reproduction, ``interp.benchmarks.planning.tasks``,
    is one)."""
    if task is None:
        raise ValueError("branch_awareness needs task=<a PlanningTask whose examples have >= 2 answers and a decoy>, "
                         "e.g. the path-finding task of interp.benchmarks.planning.tasks")
    config = config or BranchConfig()
    if config.continuation not in ("greedy", "target"):
        raise ValueError(f"BranchConfig.continuation must be 'greedy' or 'target', got {config.continuation!r}")
    examples = task.examples(config.n_examples, seed=config.seed)
    if not all(len(e.answers) >= 2 and e.decoy for e in examples):
        raise ValueError("branch awareness needs examples with >= 2 answers and a decoy")
    prompts = [e.prompt for e in examples]
    answer_ids = _text_ids(model, [a for e in examples for a in e.answers])
    n_new = max(len(t) for t in answer_ids)
    gen = _generate(model, prompts, n_new, False, 1.0, config.seed, config.batch_size)
    texts = [_decode(model, g) for g in gen]
    acc = float(np.mean([bool(task.is_correct(e, t)) for e, t in zip(examples, texts)]))
    used, alts, gens = [], [], []
    it = iter(answer_ids)
    for i, (e, t, g) in enumerate(zip(examples, texts, gen)):
        words = t.split()
        ids = [next(it) for _ in e.answers]
        if config.continuation == "target":
            hit = [next((j for j, a in enumerate(e.answers) if a == e.target), 0)]
        else:
            hit = [j for j, a in enumerate(e.answers) if words[:len(a.split())] == a.split()
                   or torch.equal(g[:len(ids[j])], ids[j])]
        if hit:
            used.append(i)
            gens.append(e.answers[hit[0]])
            alts.append(next(a for j, a in enumerate(e.answers) if j != hit[0]))
    if len(used) < 10:
        raise ValueError(f"only {len(used)} of {len(examples)} examples were solved; branch MIs need more")
    ex = [examples[i] for i in used]
    prompt_ids = _prompt_ids(model, [e.prompt for e in ex], config.batch_size)
    h_sets = harvest_sets(model, prompt_ids, [(i, len(p) - 1) for i, p in enumerate(prompt_ids)],
                          {"H": SetSpec.prefix(_layers_of_h(model, config))}, hook=config.hook,
                          batch_size=config.batch_size)["H"]
    path_layers = list(config.path_layers) if config.path_layers is not None else [final_layer(model)]
    paths = {"alt": alts, "decoy": [e.decoy for e in ex], "generated": gens}
    path_sets = {}
    for name, texts_ in paths.items():
        if config.path_context == "alone":
            full = _prompt_ids(model, texts_, config.batch_size)
            bare = _text_ids(model, texts_)
            seqs = full
            anchors = [(i, len(f) - len(b)) for i, (f, b) in enumerate(zip(full, bare))]
            spec = SetSpec.span(path_layers, 0, None)
        elif config.path_context == "prompt":
            bare = _text_ids(model, texts_)
            seqs = [torch.cat([p, b]) for p, b in zip(prompt_ids, bare)]
            anchors = [(i, len(p) - 1) for i, p in enumerate(prompt_ids)]
            spec = SetSpec.span(path_layers, 1, None)
        else:
            raise ValueError(f"path_context must be 'alone' or 'prompt', got {config.path_context!r}")
        path_sets[name] = harvest_sets(model, seqs, anchors, {"p": spec}, hook=config.hook,
                                       batch_size=config.batch_size, desc=f"harvest {name}")["p"]
    groups = {"H": {"H": h_sets}, "path": path_sets}
    rng = np.random.default_rng(config.seed)
    swap = rng.random(len(ex)) < 0.5
    ratios, controls, rows, summaries, first = [], [], [], {}, {}
    for s in range(config.n_seeds):
        codes, summ = fit_codes(groups, config, seed=s)
        summaries[f"seed{s}"] = summ
        zh, za, zd, zg = codes["H"]["H"], codes["path"]["alt"], codes["path"]["decoy"], codes["path"]["generated"]
        if s == 0:
            first = {"H": zh, "alt": za, "decoy": zd, "generated": zg}
        a = mi_with_null(zh, za, n_perm=config.n_perm, seed=s)
        d = mi_with_null(zh, zd, n_perm=config.n_perm, seed=s)
        g = mutual_information(zh, zg)
        x, y = np.where(swap, zd, za), np.where(swap, za, zd)
        ratios.append(a[0] / d[0] if d[0] > 0 else float("inf"))
        mx, my = mutual_information(zh, x), mutual_information(zh, y)
        controls.append(mx / my if my > 0 else float("inf"))
        rows.append((a[0], d[0], g, a[1], d[1], max(a[2], d[2])))
    m = np.asarray(rows).mean(0)
    r, r_std = _stats(ratios)
    c, c_std = _stats(controls)
    ca, cd = m[0] - m[3], m[1] - m[4]
    return BranchResult(task=getattr(task, "name", type(task).__name__), ratio=r, ratio_std=r_std,
                        ratio_corrected=float(ca / cd) if cd > 0 else float("inf"), control_ratio=c,
                        control_ratio_std=c_std, mi_alt=float(m[0]), mi_decoy=float(m[1]), mi_generated=float(m[2]),
                        null_alt=float(m[3]), null_decoy=float(m[4]), null_std=float(m[5]), accuracy=acc,
                        n=len(ex), n_codes=config.n_codes, ratios=ratios, config=_config_dict(config),
                        vqvae=summaries, codes=first, example_index=np.asarray(used))


# ----------------------------------------------------------------------------------------- block x layer map
@dataclass
class BlockMapResult(Result):
    """Position-block x layer maps (arrays ``[n_blocks + 1, n_layers]``; row ``k = 0`` is the single state at T).

    ``nmi_t``: null-corrected ``nMI(B_k^l; Z_T^L)``; ``nmi_next``: ``nMI(B_k^l; Z_{T+1}^L)``; ``cnmi_t``:
    conditional ``nMI(B_k^l; Z_T^L | Z_T^l)`` (row 0 undefined: NaN). Each map is normalised by its own
    largest corrected value; ``mi_*`` / ``null_*`` hold the raw MIs and null means (nats)."""

    source: str
    blocks: list
    layers: list
    block_size: int
    nmi_t: np.ndarray
    nmi_next: np.ndarray
    cnmi_t: np.ndarray
    mi_t: np.ndarray
    mi_next: np.ndarray
    cmi_t: np.ndarray
    null_t: np.ndarray
    null_next: np.ndarray
    null_cond: np.ndarray
    null_std: np.ndarray
    n: int
    n_codes: int
    config: dict
    vqvae: dict

    def to_frame(self):
        import pandas as pd

        rows = []
        for i, k in enumerate(self.blocks):
            for j, l in enumerate(self.layers):
                rows.append({"block": k, "layer": l, "nmi_t": self.nmi_t[i, j], "nmi_next": self.nmi_next[i, j],
                             "cnmi_t": self.cnmi_t[i, j], "mi_t": self.mi_t[i, j], "null_t": self.null_t[i, j],
                             "mi_next": self.mi_next[i, j], "null_next": self.null_next[i, j],
                             "cmi_t": self.cmi_t[i, j], "null_cond": self.null_cond[i, j]})
        return pd.DataFrame(rows)

    def figure(self):
        from plotly.subplots import make_subplots
        import plotly.graph_objects as go

        titles = ("nMI(B_k^l; Z_T^L)", "nMI(B_k^l; Z_T+1^L)", "nMI(B_k^l; Z_T^L | Z_T^l)")
        fig = make_subplots(rows=1, cols=3, subplot_titles=titles)
        labels = [("T" if k == 0 else f"B{k}") for k in self.blocks]
        for c, z in enumerate((self.nmi_t, self.nmi_next, self.cnmi_t), start=1):
            fig.add_trace(go.Heatmap(z=z, x=[str(l) for l in self.layers], y=labels, coloraxis="coloraxis"),
                          row=1, col=c)
            fig.update_xaxes(title_text="layer", row=1, col=c)
        fig.update_yaxes(title_text="position block (k=1 most recent)", row=1, col=1)
        fig.update_layout(coloraxis=dict(colorscale="Viridis"),
                          title=f"Where decision information lives: {self.source} (block size {self.block_size})")
        return fig


def _text_anchors(model: Model, texts: Sequence[str], config: BlockMapConfig):
    need = config.n_blocks * config.block_size
    rng = random.Random(config.seed)
    seqs, anchors = [], []
    for b in model.batches(list(texts), config.batch_size, padding_side="right", max_length=config.max_tokens):
        for ids, m in zip(b["input_ids"], b["attention_mask"]):
            s = ids[m.bool()].cpu()
            lo, hi = need, len(s) - 2  # T+1 must exist
            if hi < lo:
                continue
            seqs.append(s)
            for t in rng.sample(range(lo, hi + 1), min(config.anchors_per_text, hi - lo + 1)):
                anchors.append((len(seqs) - 1, t))
    return seqs, anchors


def block_layer_map(model: Model, data=None, config: BlockMapConfig | None = None) -> BlockMapResult:
    """Block x layer maps on a task (prompt + reference target, anchor = last prompt token) or on plain
    texts (a list of strings; ``anchors_per_text`` random anchors per text with room for every block).
    ``data=None``: the built-in real text, ``ceil(n_examples / anchors_per_text)`` passages of
    :func:`interp.data.text_passages`."""
    config = config or BlockMapConfig()
    if data is None:
        from interp.data import text_passages
        data = text_passages(-(-config.n_examples // config.anchors_per_text))
    need = config.n_blocks * config.block_size
    if isinstance(data, (list, tuple)) and all(isinstance(t, str) for t in data):
        seqs, anchors = _text_anchors(model, data, config)
        source = f"{len(data)} texts"
    else:
        examples = data.examples(config.n_examples, seed=config.seed)
        p_ids = _prompt_ids(model, [e.prompt for e in examples], config.batch_size)
        t_ids = _text_ids(model, [e.target for e in examples])
        seqs, anchors = [], []
        for p, t in zip(p_ids, t_ids):
            if len(p) - 1 >= need and len(t) >= 1:
                seqs.append(torch.cat([p, t[:1]]))
                anchors.append((len(seqs) - 1, len(p) - 1))
        source = getattr(data, "name", type(data).__name__)
    if len(anchors) < 10:
        raise ValueError(f"only {len(anchors)} anchors have {need} earlier tokens and a next token")
    anchors = anchors[:config.n_examples] if len(anchors) > config.n_examples else anchors
    L = final_layer(model)
    layers = list(config.map_layers) if config.map_layers is not None else list(range(model.cfg.n_layers))
    blocks = list(range(1, config.n_blocks + 1))
    specs: dict[str, SetSpec] = {"zT": SetSpec.state(L, 0), "zN": SetSpec.state(L, 1)}
    for l in layers:
        specs[f"s{l}"] = SetSpec.state(l, 0)
        for k in blocks:
            specs[f"b{l}_{k}"] = SetSpec.block(l, k, config.block_size)
    sets = harvest_sets(model, seqs, anchors, specs, hook=config.hook, batch_size=config.batch_size)
    return block_map_from_sets(sets, layers, config, source)


def block_map_from_sets(sets: dict[str, StateSets], layers: Sequence[int], config: BlockMapConfig,
                        source: str = "sets") -> BlockMapResult:
    """The coding and MI part of :func:`block_layer_map` on harvested sets (names ``zT``, ``zN``, ``s{l}``,
    ``b{l}_{k}`` for ``k = 1..n_blocks``), e.g. sets cached from an earlier harvest."""
    layers = list(layers)
    blocks = list(range(1, config.n_blocks + 1))
    groups: dict[str, dict[str, StateSets]] = {"single": {"zT": sets["zT"], "zN": sets["zN"],
                                                           **{f"s{l}": sets[f"s{l}"] for l in layers}}}
    for l in layers:
        groups[f"blocks{l}"] = {f"b{l}_{k}": sets[f"b{l}_{k}"] for k in blocks}
    shape = (len(blocks) + 1, len(layers))
    acc = {k: np.zeros((config.n_seeds,) + shape) for k in ("mi_t", "mi_n", "cmi", "null_t", "null_n", "null_c", "std")}
    summaries = {}
    for s in range(config.n_seeds):
        codes, summ = fit_codes(groups, config, seed=s)
        summaries[f"seed{s}"] = summ
        zt, zn = codes["single"]["zT"], codes["single"]["zN"]
        for j, l in enumerate(layers):
            cells = [codes["single"][f"s{l}"]] + [codes[f"blocks{l}"][f"b{l}_{k}"] for k in blocks]
            cond = codes["single"][f"s{l}"]
            for i, z in enumerate(cells):
                a = mi_with_null(z, zt, n_perm=config.n_perm, seed=s)
                b = mi_with_null(z, zn, n_perm=config.n_perm, seed=s)
                acc["mi_t"][s, i, j], acc["null_t"][s, i, j] = a[0], a[1]
                acc["mi_n"][s, i, j], acc["null_n"][s, i, j] = b[0], b[1]
                stds = [a[2], b[2]]
                if i == 0:
                    acc["cmi"][s, i, j] = acc["null_c"][s, i, j] = np.nan
                else:
                    c = mi_with_null(z, zt, c=cond, n_perm=config.n_perm, seed=s)
                    acc["cmi"][s, i, j], acc["null_c"][s, i, j] = c[0], c[1]
                    stds.append(c[2])
                acc["std"][s, i, j] = max(stds)
    m = {k: v.mean(0) for k, v in acc.items()}
    return BlockMapResult(source=source, blocks=[0] + blocks, layers=layers, block_size=config.block_size,
                          nmi_t=_nmi(m["mi_t"] - m["null_t"]), nmi_next=_nmi(m["mi_n"] - m["null_n"]),
                          cnmi_t=_nmi(m["cmi"] - m["null_c"]), mi_t=m["mi_t"], mi_next=m["mi_n"], cmi_t=m["cmi"],
                          null_t=m["null_t"], null_next=m["null_n"], null_cond=m["null_c"], null_std=m["std"],
                          n=len(zt), n_codes=config.n_codes, config=_config_dict(config), vqvae=summaries)
