"""Real protein data that installs offline, and the probe tasks labelled from it.

Sequences: pyhmmer's bundled test proteome ``tests/data/seqs/938293.PRJEB85.HG003687.faa`` (2,100 predicted
proteins of one bacterial genome assembly, Prodigal headers with per-gene GC content), located with
``importlib``. A fixed random split by protein gives the training set of the protein language models (and of the
RD scalers) and a held-out set on which every probe is trained and scored.

Tasks (each says what it measures):

per residue
  * ``hydropathy_w9``: Kyte-Doolittle hydropathy averaged over the 9-residue window centred on the residue
    (local hydrophobic environment; needs the neighbours, not only the residue's identity);
  * ``charge_w9``: net charge (K, R +1; D, E -1; H +0.1) over the same window (local electrostatics);
  * ``helix_w9``: Chou-Fasman alpha-helix propensity averaged over the window (local secondary-structure
    tendency);
  * ``tm_segment`` (binary): the residue lies in a 19-residue window of mean hydropathy >= 1.6, Kyte and
    Doolittle's rule for a membrane-spanning helix;
  * ``hmm_domain`` (binary): the residue lies inside the envelope of a domain hit (``hmmsearch``, domain
    i-E-value <= 1e-3) of the protein profile HMMs that pyhmmer ships (KR, LuxC, 2-Hacid_dh_C, bmyD, the RREFam
    set, Thioesterase); scored only on the proteins with such a hit (where the domain is inside the protein).

per sequence (mean-pooled embeddings)
  * ``gc_content``: GC content of the gene (Prodigal ``gc_cont``), a genomic property that shapes codon and
    hence amino-acid usage but is not a function of the protein sequence;
  * ``log_length``: log of the protein length;
  * ``gravy``: mean Kyte-Doolittle hydropathy (grand average of hydropathy);
  * ``net_charge``: net charge per residue;
  * ``frac_aromatic``: fraction of F, W, Y;
  * ``membrane`` (binary): at least one ``tm_segment`` window in the protein.
"""
from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = [
    "AMINO_ACIDS", "KYTE_DOOLITTLE", "CHOU_FASMAN_HELIX", "ProteinSet", "pyhmmer_data_dir", "load_proteins",
    "split_proteins", "window_mean", "residue_tasks", "sequence_tasks", "hmm_domain_labels", "Task", "TASKS",
]

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
KYTE_DOOLITTLE = {"A": 1.8, "R": -4.5, "N": -3.5, "D": -3.5, "C": 2.5, "Q": -3.5, "E": -3.5, "G": -0.4, "H": -3.2,
                  "I": 4.5, "L": 3.8, "K": -3.9, "M": 1.9, "F": 2.8, "P": -1.6, "S": -0.8, "T": -0.7, "W": -0.9,
                  "Y": -1.3, "V": 4.2}
CHARGE = {"K": 1.0, "R": 1.0, "D": -1.0, "E": -1.0, "H": 0.1}
CHOU_FASMAN_HELIX = {"E": 1.51, "M": 1.45, "A": 1.42, "L": 1.21, "K": 1.16, "F": 1.13, "Q": 1.11, "W": 1.08,
                     "I": 1.08, "V": 1.06, "D": 1.01, "H": 1.00, "R": 0.98, "T": 0.83, "S": 0.77, "C": 0.70,
                     "Y": 0.69, "N": 0.67, "P": 0.57, "G": 0.57}
FASTA = "938293.PRJEB85.HG003687.faa"


@dataclass(frozen=True)
class Task:
    """A probe task: ``level`` is ``"residue"`` or ``"sequence"``; ``kind`` ``"regression"`` (scored by
    Spearman) or ``"binary"`` (scored by AUROC)."""

    name: str
    level: str
    kind: str
    description: str


TASKS: dict[str, Task] = {t.name: t for t in [
    Task("hydropathy_w9", "residue", "regression", "Kyte-Doolittle hydropathy, 9-residue window mean"),
    Task("charge_w9", "residue", "regression", "net charge (K,R +1; D,E -1; H +0.1), 9-residue window mean"),
    Task("helix_w9", "residue", "regression", "Chou-Fasman helix propensity, 9-residue window mean"),
    Task("tm_segment", "residue", "binary", "inside a 19-residue window of mean hydropathy >= 1.6"),
    Task("hmm_domain", "residue", "binary", "inside a pyhmmer hmmsearch domain envelope (shipped HMMs)"),
    Task("gc_content", "sequence", "regression", "gene GC content (Prodigal gc_cont)"),
    Task("log_length", "sequence", "regression", "log protein length"),
    Task("gravy", "sequence", "regression", "mean Kyte-Doolittle hydropathy"),
    Task("net_charge", "sequence", "regression", "net charge per residue"),
    Task("frac_aromatic", "sequence", "regression", "fraction of F, W, Y"),
    Task("membrane", "sequence", "binary", "has a predicted transmembrane segment"),
]}


@dataclass
class ProteinSet:
    """Proteins with their FASTA ids, sequences (upper-case, 20 standard letters plus X) and header fields."""

    ids: list[str]
    sequences: list[str]
    gc_content: np.ndarray          # [n] float (NaN where the header has none)
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.sequences)

    def subset(self, index: Sequence[int]) -> "ProteinSet":
        index = list(index)
        return ProteinSet([self.ids[i] for i in index], [self.sequences[i] for i in index],
                          self.gc_content[index], dict(self.meta))

    @property
    def n_residues(self) -> int:
        return sum(len(s) for s in self.sequences)


def pyhmmer_data_dir() -> Path:
    """``tests/data`` of the installed pyhmmer package (found with ``importlib``, not a hard-coded path)."""
    spec = importlib.util.find_spec("pyhmmer")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("pyhmmer is not installed; it ships the protein sequences and HMMs used here "
                                  "(pip install pyhmmer)")
    folder = Path(spec.origin).parent / "tests" / "data"
    if not (folder / "seqs" / FASTA).is_file():
        raise FileNotFoundError(f"pyhmmer's bundled test data {folder / 'seqs' / FASTA} is missing")
    return folder


def load_proteins(max_length: int | None = None) -> ProteinSet:
    """The 2,100 proteins of pyhmmer's bundled proteome (``*`` stop marks removed; non-standard letters -> X).

    ``max_length``: drop proteins longer than this (``None``: keep all).
    """
    path = pyhmmer_data_dir() / "seqs" / FASTA
    ids, seqs, gcs, chunks, header = [], [], [], [], None

    def flush():
        if header is None:
            return
        seq = re.sub(f"[^{AMINO_ACIDS}]", "X", "".join(chunks).upper().rstrip("*"))
        m = re.search(r"gc_cont=([0-9.]+)", header)
        if seq and (max_length is None or len(seq) <= max_length):
            ids.append(header[1:].split()[0])
            seqs.append(seq)
            gcs.append(float(m.group(1)) if m else float("nan"))

    for line in path.read_text().splitlines():
        if line.startswith(">"):
            flush()
            header, chunks = line, []
        else:
            chunks.append(line.strip())
    flush()
    return ProteinSet(ids, seqs, np.asarray(gcs), {"source": f"pyhmmer tests/data/seqs/{FASTA}"})


def split_proteins(proteins: ProteinSet, holdout_fraction: float = 0.2, seed: int = 0) -> tuple[ProteinSet, ProteinSet]:
    """Random split by protein into (train, held-out)."""
    if not 0 < holdout_fraction < 1:
        raise ValueError(f"holdout_fraction must lie in (0, 1), got {holdout_fraction}")
    order = np.random.default_rng(seed).permutation(len(proteins))
    n_hold = int(round(holdout_fraction * len(proteins)))
    return proteins.subset(sorted(order[n_hold:])), proteins.subset(sorted(order[:n_hold]))


def _scale(seq: str, table: dict[str, float]) -> np.ndarray:
    return np.array([table.get(a, 0.0) for a in seq], dtype=np.float64)


def window_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean over the centred window of odd length ``window`` (truncated at the ends)."""
    if window < 1 or window % 2 == 0:
        raise ValueError(f"window must be a positive odd number, got {window}")
    half = window // 2
    c = np.concatenate([[0.0], np.cumsum(values)])
    i = np.arange(len(values))
    lo, hi = np.maximum(i - half, 0), np.minimum(i + half + 1, len(values))
    return (c[hi] - c[lo]) / (hi - lo)


def _tm_mask(seq: str, window: int = 19, threshold: float = 1.6) -> np.ndarray:
    """Residues covered by any full ``window`` whose mean Kyte-Doolittle hydropathy is >= ``threshold``."""
    kd = _scale(seq, KYTE_DOOLITTLE)
    n = len(seq)
    mask = np.zeros(n, dtype=bool)
    if n < window:
        return mask
    c = np.concatenate([[0.0], np.cumsum(kd)])
    starts = np.flatnonzero((c[window:] - c[:-window]) / window >= threshold)
    if starts.size:
        cover = np.zeros(n + 1)
        np.add.at(cover, starts, 1)
        np.add.at(cover, starts + window, -1)
        mask = np.cumsum(cover)[:n] > 0
    return mask


def residue_tasks(sequences: Sequence[str]) -> dict[str, list[np.ndarray]]:
    """Per-residue targets (every task of level ``"residue"`` except ``hmm_domain``): ``name -> [per protein
    array [L_i]]``."""
    return {
        "hydropathy_w9": [window_mean(_scale(s, KYTE_DOOLITTLE), 9) for s in sequences],
        "charge_w9": [window_mean(_scale(s, CHARGE), 9) for s in sequences],
        "helix_w9": [window_mean(_scale(s, {a: CHOU_FASMAN_HELIX.get(a, 1.0) for a in AMINO_ACIDS + "X"}), 9)
                     for s in sequences],
        "tm_segment": [_tm_mask(s).astype(np.float64) for s in sequences],
    }


def sequence_tasks(proteins: ProteinSet) -> dict[str, np.ndarray]:
    """Per-sequence targets ``name -> [n]``."""
    seqs = proteins.sequences
    return {
        "gc_content": np.asarray(proteins.gc_content, dtype=np.float64),
        "log_length": np.log([len(s) for s in seqs]),
        "gravy": np.array([_scale(s, KYTE_DOOLITTLE).mean() for s in seqs]),
        "net_charge": np.array([_scale(s, CHARGE).mean() for s in seqs]),
        "frac_aromatic": np.array([sum(s.count(a) for a in "FWY") / len(s) for s in seqs]),
        "membrane": np.array([float(_tm_mask(s).any()) for s in seqs]),
    }


def hmm_domain_labels(proteins: ProteinSet, e_value: float = 1e-3) -> list[np.ndarray | None]:
    """Per protein: a 0/1 array ``[L_i]`` marking residues inside an included domain envelope of any of pyhmmer's
    shipped protein HMMs (``hmmsearch``, domain i-E-value <= ``e_value``), or ``None`` for proteins without a hit."""
    import pyhmmer

    data = pyhmmer_data_dir()
    alphabet = pyhmmer.easel.Alphabet.amino()
    hmms = []
    for fn in sorted((data / "hmms" / "txt").glob("*.hmm")):
        with pyhmmer.plan7.HMMFile(str(fn)) as fh:
            hmms.extend(h for h in fh if h.alphabet == alphabet)
    digital = pyhmmer.easel.DigitalSequenceBlock(alphabet, [
        pyhmmer.easel.TextSequence(name=str(i).encode(), sequence=s).digitize(alphabet)
        for i, s in enumerate(proteins.sequences)])
    labels: list[np.ndarray | None] = [None] * len(proteins)
    for hits in pyhmmer.hmmsearch(hmms, digital, cpus=1, domE=e_value, E=e_value):
        for hit in hits:
            if not hit.included:
                continue
            i = int(hit.name.decode() if isinstance(hit.name, bytes) else hit.name)
            for dom in hit.domains:
                if dom.i_evalue > e_value:
                    continue
                if labels[i] is None:
                    labels[i] = np.zeros(len(proteins.sequences[i]))
                labels[i][dom.env_from - 1: dom.env_to] = 1.0
    return labels
