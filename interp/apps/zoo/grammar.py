"""``zoo:toy-grammar``: a small Llama trained from scratch on the probabilistic grammar of :mod:`interp.data.grammar`
(number agreement across nested relative clauses; exact next-token distributions), and its exact-continuation
metrics (:func:`evaluate`)."""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from interp.data.grammar import VERBS_INTRANSITIVE, VERBS_TRANSITIVE, GrammarConfig, ToyGrammar


# ----------------------------------------------------------------------------------------- the zoo entry
@dataclass(frozen=True)
class ToyGrammarConfig:
    """Model size and training recipe of ``zoo:toy-grammar``."""

    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    d_mlp: int = 512
    seq_len: int = 64
    batch_size: int = 16
    steps: int = 300
    lr: float = 3e-3
    warmup: int = 30
    weight_decay: float = 0.01
    seed: int = 0
    n_eval_docs: int = 64
    #: intra-op threads while training: the matrices are tiny, so one thread is as fast as several on a
    #: free machine, much faster on a loaded one, and makes the build reproducible across core counts
    num_threads: int | None = 1
    grammar: GrammarConfig = GrammarConfig()
    #: build fails unless the mean KL(true || model) per token is below this (nats)
    max_kl: float = 0.05

    def to_params(self) -> dict:
        return asdict(self)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "ToyGrammarConfig":
        params = dict(params)
        params["grammar"] = GrammarConfig(**params.get("grammar", {}))
        return cls(**params)


def make_tokenizer(grammar: ToyGrammar):
    """A word-level fast tokenizer over the grammar's vocabulary that prepends ``<bos>``."""
    from interp.training import word_level_tokenizer

    return word_level_tokenizer(grammar.token_id)


def evaluate(model, grammar: ToyGrammar, docs: Sequence[Sequence[str]]) -> dict:
    """Exact-continuation metrics of a model on documents of the grammar.

    Returns the mean KL(true || model) per token (nats), the mean probability mass the model puts on
    valid next tokens, the top-1 validity rate, the number-agreement accuracy (correct-number verb
    mass > wrong-number verb mass at positions that require a verb of fixed number), the model's
    cross-entropy and the grammar's entropy rate on the same positions.
    """
    import torch

    ids = torch.tensor([[grammar.token_id[w] for w in d] for d in docs])
    target = grammar.target_matrix(docs)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
    valid = target > 0
    kl = (target * (torch.log(target.clamp_min(1e-30)) - logp)).masked_fill(~valid, 0).sum(-1)
    mass = (logp.exp() * valid).sum(-1)
    top1 = valid.gather(-1, logp.argmax(-1, keepdim=True)).squeeze(-1).float()
    ent = -(target * torch.log(target.clamp_min(1e-30))).sum(-1)
    xent = -(target * logp).masked_fill(~valid, 0).sum(-1)
    verbs = {n: [grammar.token_id[w] for w in VERBS_INTRANSITIVE[n] + VERBS_TRANSITIVE[n]] for n in ("sg", "pl")}
    hits = {False: [0, 0], True: [0, 0]}  # attractor -> [correct, total]
    for b, doc in enumerate(docs):
        p = logp[b].exp()
        for t, n, attractor in grammar.agreement_positions(doc):
            other = "pl" if n == "sg" else "sg"
            hits[attractor][0] += int(p[t, verbs[n]].sum() > p[t, verbs[other]].sum())
            hits[attractor][1] += 1
    correct, total = hits[False][0] + hits[True][0], hits[False][1] + hits[True][1]
    return {"kl_per_token": float(kl.mean()), "valid_mass": float(mass.mean()), "top1_valid": float(top1.mean()),
            "agreement_accuracy": correct / max(total, 1), "agreement_positions": total,
            "agreement_accuracy_attractor": hits[True][0] / max(hits[True][1], 1),
            "attractor_positions": hits[True][1],
            "model_xent": float(xent.mean()), "true_entropy": float(ent.mean())}


def build_toy_grammar(out: Path, params: Mapping[str, Any]) -> dict:
    """Train the toy-grammar Llama from scratch and save it with its word-level tokenizer."""
    from interp.training import limit_threads

    cfg = ToyGrammarConfig.from_params(params)
    with limit_threads(cfg.num_threads, blas=False):
        return _train_toy_grammar(out, cfg)


def _train_toy_grammar(out: Path, cfg: ToyGrammarConfig) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from interp.training import LMTrainConfig, quiet_transformers, train_lm

    grammar = ToyGrammar(cfg.grammar)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    V = len(grammar.vocab)
    config = LlamaConfig(vocab_size=V, hidden_size=cfg.d_model, intermediate_size=cfg.d_mlp,
                         num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                         num_key_value_heads=cfg.n_heads, max_position_embeddings=max(128, 2 * cfg.seq_len),
                         bos_token_id=grammar.token_id["<bos>"], eos_token_id=grammar.token_id["<eos>"],
                         pad_token_id=grammar.token_id["<pad>"], tie_word_embeddings=False,
                         architectures=["LlamaForCausalLM"])
    with quiet_transformers():
        model = LlamaForCausalLM(config)

    def batches():
        while True:
            docs = [grammar.sample_document(rng, cfg.seq_len) for _ in range(cfg.batch_size)]
            yield torch.tensor([[grammar.token_id[w] for w in d] for d in docs])

    losses = train_lm(model, batches(), LMTrainConfig(steps=cfg.steps, lr=cfg.lr, warmup=cfg.warmup,
                                                      weight_decay=cfg.weight_decay), desc="toy-grammar: training")
    model.eval()
    eval_rng = random.Random(cfg.seed + 10_007)  # fresh documents, never trained on
    docs = [grammar.sample_document(eval_rng, cfg.seq_len) for _ in range(cfg.n_eval_docs)]
    metrics = evaluate(model, grammar, docs)
    if not metrics["kl_per_token"] < cfg.max_kl:
        raise RuntimeError(f"toy-grammar training did not converge: KL {metrics['kl_per_token']:.4f} nats/token "
                           f"(need < {cfg.max_kl}); metrics {metrics}")
    with quiet_transformers():
        model.save_pretrained(out, safe_serialization=True)
        make_tokenizer(grammar).save_pretrained(out)
    metrics.update(final_train_loss=sum(losses[-50:]) / len(losses[-50:]),
                   n_params=sum(p.numel() for p in model.parameters()))
    return metrics
