"""Small ESM-2-style protein masked language models trained locally, and their per-residue embeddings.

No protein LM weights install offline, so the family is trained here on the training split of pyhmmer's proteome
(:mod:`.proteins`): transformers' ``EsmForMaskedLM`` (ESM-2 architecture: pre-LN, rotary positions, token
dropout, ESM-2's 33-token alphabet) at several widths, masked-LM objective with ESM's 15 % / 80-10-10 masking on
random crops. Each model is a zoo entry (see :mod:`.zoo`) cached as a plain Hugging Face folder.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from interp.progress import progress
from interp.training import set_seed, warmup_cosine_fraction

from .proteins import AMINO_ACIDS, load_proteins, split_proteins

__all__ = ["ESM_TOKENS", "PLMConfig", "make_tokenizer", "train_plm", "build_plm", "embed_residues",
           "load_plm", "masked_lm_eval"]

#: ESM-2's alphabet, in its order (so the token ids match fair-esm's)
ESM_TOKENS = ("<cls>", "<pad>", "<eos>", "<unk>", "L", "A", "G", "V", "S", "E", "R", "T", "I", "D", "P", "K", "Q",
              "N", "F", "Y", "M", "H", "W", "C", "X", "B", "U", "Z", "O", ".", "-", "<null_1>", "<mask>")


@dataclass(frozen=True)
class PLMConfig:
    """One protein MLM of the family and its training recipe.

    ``max_proteins``: use only the first this many training proteins (``None``: all); toy builds set it small.
    ``max_heldout_loss``: the build fails unless the held-out masked-token cross-entropy (nats) is below this
    (``None``: below the unigram entropy of the training residues, i.e. better than amino-acid frequencies).
    """

    width: int = 64
    n_layers: int = 3
    n_heads: int = 4
    steps: int = 600
    batch_size: int = 16
    crop: int = 96
    lr: float = 2e-3
    warmup_frac: float = 0.05
    weight_decay: float = 0.01
    mask_prob: float = 0.15
    seed: int = 0
    holdout_fraction: float = 0.2
    split_seed: int = 0
    max_proteins: int | None = None
    n_eval_proteins: int = 200
    max_heldout_loss: float | None = None
    num_threads: int | None = 1

    def __post_init__(self) -> None:
        if self.width < 2 or self.width % self.n_heads:
            raise ValueError(f"width must be >= 2 and divisible by n_heads, got width={self.width}, "
                             f"n_heads={self.n_heads}")
        if (self.width // self.n_heads) % 2:
            raise ValueError(f"head dimension width/n_heads must be even for rotary embeddings, got "
                             f"{self.width // self.n_heads}")
        for name in ("n_layers", "steps", "batch_size", "crop", "n_eval_proteins"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.mask_prob < 1:
            raise ValueError(f"mask_prob must lie in (0, 1), got {self.mask_prob}")

    def to_params(self) -> dict:
        return asdict(self)


def make_tokenizer(folder: Path | None = None):
    """transformers ``EsmTokenizer`` over :data:`ESM_TOKENS` (written to ``folder`` or a temporary one)."""
    import tempfile

    from transformers import EsmTokenizer

    folder = Path(folder or tempfile.mkdtemp(prefix="esm_vocab_"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(ESM_TOKENS))
    return EsmTokenizer(str(folder / "vocab.txt"))


def _encode(seq: str) -> torch.Tensor:
    ids = {t: i for i, t in enumerate(ESM_TOKENS)}
    return torch.tensor([ids.get(a, ids["X"]) for a in seq], dtype=torch.long)


def _mask_tokens(ids: torch.Tensor, special: torch.Tensor, p: float, g: torch.Generator):
    """ESM/BERT masking of ``ids`` ``[B, T]``: choose ``p`` of the non-special positions; 80 % -> <mask>, 10 % ->
    a random amino acid, 10 % unchanged. Returns (inputs, labels with -100 where not chosen)."""
    aa = torch.tensor([ESM_TOKENS.index(a) for a in AMINO_ACIDS])
    chosen = (torch.rand(ids.shape, generator=g) < p) & ~special
    labels = ids.masked_fill(~chosen, -100)
    r = torch.rand(ids.shape, generator=g)
    inputs = ids.clone()
    inputs[chosen & (r < 0.8)] = ESM_TOKENS.index("<mask>")
    rand = chosen & (r >= 0.8) & (r < 0.9)
    inputs[rand] = aa[torch.randint(len(aa), (int(rand.sum()),), generator=g)]
    return inputs, labels


def _batch(seqs: Sequence[str], crop: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``<cls> crop <eos>`` of random windows (at most ``crop`` residues), padded: (ids, attention mask)."""
    rows = []
    for s in seqs:
        start = int(torch.randint(0, max(len(s) - crop, 0) + 1, (1,), generator=g))
        rows.append(torch.cat([torch.tensor([0]), _encode(s[start:start + crop]), torch.tensor([2])]))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), 1, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
    return ids, (ids != 1).long()


def _new_model(cfg: PLMConfig):
    from transformers import EsmConfig, EsmForMaskedLM

    config = EsmConfig(vocab_size=len(ESM_TOKENS), hidden_size=cfg.width, num_hidden_layers=cfg.n_layers,
                       num_attention_heads=cfg.n_heads, intermediate_size=4 * cfg.width,
                       max_position_embeddings=1026, position_embedding_type="rotary", pad_token_id=1,
                       mask_token_id=ESM_TOKENS.index("<mask>"), token_dropout=True, emb_layer_norm_before=False,
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                       architectures=["EsmForMaskedLM"])
    return EsmForMaskedLM(config)


@torch.no_grad()
def masked_lm_eval(model, sequences: Sequence[str], crop: int, seed: int = 1, mask_prob: float = 0.15,
                   batch_size: int = 16) -> dict:
    """Held-out masked-token cross-entropy (nats) and accuracy on random crops of ``sequences``."""
    g = torch.Generator().manual_seed(seed)
    model.eval()
    tot, correct, n = 0.0, 0, 0
    for i in range(0, len(sequences), batch_size):
        ids, att = _batch(sequences[i:i + batch_size], crop, g)
        inputs, labels = _mask_tokens(ids, ids <= 3, mask_prob, g)
        logits = model(input_ids=inputs, attention_mask=att).logits
        m = labels != -100
        tot += float(torch.nn.functional.cross_entropy(logits[m], labels[m], reduction="sum"))
        correct += int((logits[m].argmax(-1) == labels[m]).sum())
        n += int(m.sum())
    return {"heldout_loss": tot / max(n, 1), "heldout_accuracy": correct / max(n, 1), "heldout_masked": n}


def train_plm(cfg: PLMConfig):
    """Train one model on the training split; returns (model, metrics)."""
    from interp.training import LMTrainConfig, quiet_transformers, train_lm

    train, held = split_proteins(load_proteins(), cfg.holdout_fraction, cfg.split_seed)
    seqs = train.sequences[: cfg.max_proteins] if cfg.max_proteins else train.sequences
    g = set_seed(cfg.seed)
    with quiet_transformers():
        model = _new_model(cfg)

    def batches():  # drawn from ``g`` one step at a time, as training goes
        for _ in range(cfg.steps):
            pick = torch.randint(len(seqs), (cfg.batch_size,), generator=g)
            ids, att = _batch([seqs[int(i)] for i in pick], cfg.crop, g)
            inputs, labels = _mask_tokens(ids, ids <= 3, cfg.mask_prob, g)
            yield {"input_ids": inputs, "attention_mask": att, "labels": labels}

    schedule = lambda s: warmup_cosine_fraction(s, cfg.steps, cfg.warmup_frac, 0.1)  # noqa: E731
    losses = train_lm(model, batches(), LMTrainConfig(steps=cfg.steps, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                                      betas=(0.9, 0.98), clip=1.0, schedule=schedule),
                      desc=f"protein MLM d={cfg.width}")
    counts = np.bincount(np.concatenate([_encode(s).numpy() for s in seqs]), minlength=len(ESM_TOKENS))
    freq = counts[counts > 0] / counts.sum()
    metrics = masked_lm_eval(model, held.sequences[: cfg.n_eval_proteins], cfg.crop)
    metrics.update(unigram_entropy=float(-(freq * np.log(freq)).sum()), final_train_loss=float(np.mean(losses[-50:])),
                   n_params=sum(p.numel() for p in model.parameters()), n_train_proteins=len(seqs),
                   n_train_residues=int(sum(len(s) for s in seqs)))
    limit = cfg.max_heldout_loss if cfg.max_heldout_loss is not None else metrics["unigram_entropy"]
    if not metrics["heldout_loss"] < limit:
        raise RuntimeError(f"protein MLM d={cfg.width} did not train: held-out loss {metrics['heldout_loss']:.4f} "
                           f"nats, need < {limit:.4f}; metrics {metrics}")
    return model, metrics


def build_plm(out: Path, params: Mapping[str, Any]) -> dict:
    """Zoo builder: train and save an HF folder (``EsmForMaskedLM`` + ``EsmTokenizer``)."""
    from interp.training import limit_threads, quiet_transformers

    cfg = PLMConfig(**params)
    with limit_threads(cfg.num_threads, blas=False):
        model, metrics = train_plm(cfg)
    with quiet_transformers():
        model.save_pretrained(out, safe_serialization=True)
        make_tokenizer(out).save_pretrained(out)
    return metrics


def load_plm(name_or_path: str | Path):
    """An ``EsmForMaskedLM`` in eval mode from a zoo name (``zoo:protein-mlm-64``) or an HF folder."""
    from transformers import EsmForMaskedLM

    from interp.training import quiet_transformers

    folder = Path(name_or_path)
    if isinstance(name_or_path, str) and not folder.is_dir():
        from interp import zoo

        folder = zoo.path(name_or_path)
    with quiet_transformers():
        return EsmForMaskedLM.from_pretrained(folder).eval()


@torch.no_grad()
def embed_residues(model, sequences: Sequence[str], batch_size: int = 16, max_length: int = 1022) -> list[torch.Tensor]:
    """Per-residue final-layer embeddings, BOS/EOS and padding excluded: one ``[L_i, width]`` tensor per sequence
    (sequences longer than ``max_length`` are truncated to it, like ESM's extraction script).

    Sequences are batched by length (padded batches give the same values as one at a time, up to float error).
    """
    if isinstance(sequences, str):
        raise TypeError("sequences must be a list of strings, not one string")
    if any(len(s) == 0 for s in sequences):
        raise ValueError("empty protein sequence")
    model.eval()
    order = np.argsort([len(s) for s in sequences], kind="stable")
    out: list[torch.Tensor | None] = [None] * len(sequences)
    batches = range(0, len(order), batch_size)
    for start in progress(batches, desc="embedding residues", total=len(batches)):
        idx = order[start:start + batch_size]
        rows = [torch.cat([torch.tensor([0]), _encode(sequences[i][:max_length]), torch.tensor([2])]) for i in idx]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), 1, dtype=torch.long)
        for j, r in enumerate(rows):
            ids[j, :len(r)] = r
        hidden = model.esm(input_ids=ids, attention_mask=(ids != 1).long()).last_hidden_state
        for j, i in enumerate(idx):
            out[i] = hidden[j, 1:len(rows[j]) - 1].float().clone()
    return out  # type: ignore[return-value]

