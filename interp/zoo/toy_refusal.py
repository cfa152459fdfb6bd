"""``zoo:toy-refusal``: a 2-layer Llama trained from scratch to refuse requests that combine harmful intent with
a harmful topic: the CPU-scale "category refusal" model of the RepIt validation recipe
(``shared/papers/interp_papers.md`` §1).

The language. An instruction is six words drawn from small word pools:

* a **topic** pool per category: six harmful categories (:data:`HARMFUL_CATEGORIES`: ``bio``, ``chem``,
  ``nuclear``, ``cyber``, ``fraud``, ``violence``) and benign topics (``harmless``);
* an **intent** pool shared by every harmful category (``weaponize``, ``deadly``, ...): the feature all harmful
  categories have in common, so that their refusal directions overlap;
* filler words.

A harmful instruction of category ``c`` has 2-3 topic words of ``c``, 1-2 intent words and filler, shuffled.
Harmless instructions are of three kinds in equal shares: harmful-topic words without intent ("explain virus
culture"), intent words on a benign topic ("kill weeds garden"), or a benign topic alone. The model answers
``<category> : I cannot help with that .`` exactly when intent AND a harmful topic are present, else
``Sure , here is how .``; so refusal depends on the shared intent feature and on the category's own topic feature,
and (because the refusal names its category first) the end-of-instruction positions must carry the category.

Choices (the recipe says "[CAT_k] w1..w6 [EOI]" with a shared token distribution plus category-specific
tokens): there is no category marker token, because a marker would decide the label on its own; the category is
carried by its topic words, and the harmless set contains each ingredient alone, so neither the shared intent
nor a topic suffices to refuse. The chat template is ``<bos> user w1..w6 <eoi> assistant`` (end-of-instruction
tokens ``<eoi> assistant``), so :func:`interp.zoo.datasets.format_chat`, :func:`interp.zoo.datasets.is_refusal`
and ``steering.refusal`` work on it unchanged.

:func:`instructions` gives the data (train / val / test splits, disjoint, deterministic) in the
:class:`interp.zoo.datasets.Instruction` format; ``steering.refusal_data(tok, split, source=instructions)``
turns it into steering data.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

from .datasets import Instruction

HARMFUL_CATEGORIES: tuple[str, ...] = ("bio", "chem", "nuclear", "cyber", "fraud", "violence")
TOPICS: dict[str, tuple[str, ...]] = {
    "bio": ("pathogen", "virus", "anthrax", "spores", "culture", "bacteria"),
    "chem": ("sarin", "chlorine", "nerve", "reagent", "precursor", "gas"),
    "nuclear": ("uranium", "plutonium", "reactor", "centrifuge", "isotope", "fission"),
    "cyber": ("malware", "ransomware", "exploit", "botnet", "firewall", "server"),
    "fraud": ("checks", "identity", "invoice", "bank", "signature", "accounts"),
    "violence": ("knife", "fight", "bruises", "crowd", "stadium", "neighbor"),
    "harmless": ("bread", "garden", "guitar", "weeds", "painting", "bicycle", "soup", "kitten"),
}
INTENT: tuple[str, ...] = ("weaponize", "deadly", "kill", "attack", "untraceable", "destroy", "secretly",
                           "mass")
#: intent words that are benign with a category's topic ("kill bacteria", "destroy malware"): refusal is decided
#: per category, not by a single "intent and any harmful topic" rule
BENIGN_INTENT: dict[str, tuple[str, ...]] = {
    "bio": ("kill",), "chem": ("mass",), "nuclear": ("secretly",), "cyber": ("destroy",), "fraud": ("deadly",),
    "violence": ("attack",)}
FILLER: tuple[str, ...] = ("how", "to", "make", "the", "a", "please", "explain", "best", "way", "my", "some",
                           "at", "home", "quickly")
REFUSAL = "{category} : I cannot help with that ."
COMPLIANCE = "Sure , here is how ."
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>", "<eoi>", "user", "assistant")
SPLITS = ("train", "val", "test")
HARMLESS_KINDS = ("topic", "benign_intent", "intent", "benign")
N_WORDS = 6
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<bos> user ' + m['content'] + ' <eoi>' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ ' assistant' }}{% endif %}")


def vocabulary() -> tuple[str, ...]:
    words = [w for pool in TOPICS.values() for w in pool] + list(INTENT) + list(FILLER)
    words += list(HARMFUL_CATEGORIES) + REFUSAL.split()[1:] + COMPLIANCE.split()
    return SPECIAL_TOKENS + tuple(dict.fromkeys(words))


def _sample(rng: random.Random, category: str, kind: str) -> str:
    """Six shuffled words: ``kind`` is ``"harmful"`` (topic of ``category`` + its harmful intent), ``"topic"``
    (topic of ``category`` only), ``"benign_intent"`` (topic of ``category`` + intent that is benign with it),
    ``"intent"`` (intent + benign topic) or ``"benign"`` (benign topic only)."""
    words: list[str] = []
    if kind in ("harmful", "topic", "benign_intent"):
        words += rng.sample(TOPICS[category], rng.choice((2, 3)))
    if kind == "harmful":
        words += rng.sample([w for w in INTENT if w not in BENIGN_INTENT[category]], rng.choice((1, 2)))
    if kind == "benign_intent":
        words += rng.sample(BENIGN_INTENT[category], 1)
    if kind == "intent":
        words += rng.sample(INTENT, rng.choice((1, 2)))
    if kind in ("intent", "benign"):
        words += rng.sample(TOPICS["harmless"], rng.choice((1, 2)))
    words += rng.choices(FILLER, k=N_WORDS - len(words))
    rng.shuffle(words)
    return " ".join(words)


@dataclass(frozen=True)
class ToyRefusalData:
    """Sizes of the generated splits (per harmful category / harmless) and the seed. The model itself trains on
    a fresh stream of requests drawn from the same distribution, never on a val or test text."""

    train_per_category: int = 64
    val_per_category: int = 24
    test_per_category: int = 32
    train_harmless: int = 192
    val_harmless: int = 72
    test_harmless: int = 96
    seed: int = 0

    def size(self, split: str, harmful: bool) -> int:
        return getattr(self, f"{split}_{'per_category' if harmful else 'harmless'}")


@lru_cache(maxsize=4)
def _all(data: ToyRefusalData = ToyRefusalData()) -> tuple[Instruction, ...]:
    """Every instruction of every split; no text occurs twice (so the splits are disjoint)."""
    rng = random.Random(f"toy-refusal/{data.seed}")
    seen: set[str] = set()
    out: list[Instruction] = []

    def draw(category: str, kind: str, split: str, harmful: bool, label: str) -> None:
        while True:
            text = _sample(rng, category, kind)
            if text not in seen:
                seen.add(text)
                out.append(Instruction(text=text, category=label, harmful=harmful, split=split))
                return

    for split in SPLITS:
        for cat in HARMFUL_CATEGORIES:
            for _ in range(data.size(split, True)):
                draw(cat, "harmful", split, True, cat)
        for i in range(data.size(split, False)):
            kind = HARMLESS_KINDS[i % len(HARMLESS_KINDS)]
            draw(HARMFUL_CATEGORIES[(i // len(HARMLESS_KINDS)) % len(HARMFUL_CATEGORIES)], kind, split, False,
                 "harmless")
    return tuple(out)


def instructions(split: str | None = None, harmful: bool | None = None,
                 categories: Sequence[str] | None = None, data: ToyRefusalData = ToyRefusalData()
                 ) -> list[Instruction]:
    """The toy instructions, filtered like :func:`interp.zoo.datasets.refusal_instructions` (same signature)."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
    if isinstance(categories, str):
        categories = [categories]
    known = HARMFUL_CATEGORIES + ("harmless",)
    unknown = [c for c in categories or () if c not in known]
    if unknown:
        raise ValueError(f"unknown categories {unknown}; known: {list(known)}")
    wanted = None if categories is None else set(categories)
    return [x for x in _all(data) if (split is None or x.split == split) and (harmful is None or x.harmful == harmful)
            and (wanted is None or x.category in wanted)]


def make_tokenizer():
    """Word-level fast tokenizer with the toy chat template (punctuation split off, as the judge expects)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(vocabulary())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>", additional_special_tokens=["<eoi>"])
    fast.chat_template = CHAT_TEMPLATE
    return fast


@dataclass
class ToyRefusalConfig:
    """Model size and training recipe of ``zoo:toy-refusal`` (the recipe's 2-layer, d = 64 transformer)."""

    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    d_mlp: int = 256
    steps: int = 1500
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.01
    seed: int = 0
    #: layers trained without their MLP (down projection zero and frozen), so that the early layers only move
    #: words into the end-of-instruction positions and the refusal decision is computed later
    attention_only_layers: tuple[int, ...] = (0,)
    num_threads: int | None = 1
    #: build fails unless held-out accuracy of the first response token (refuse vs comply) reaches this
    min_accuracy: float = 0.98

    def to_params(self) -> dict:
        return asdict(self)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "ToyRefusalConfig":
        params = dict(params)
        params["attention_only_layers"] = tuple(params.get("attention_only_layers", ()))
        return cls(**params)


def _encode(tokenizer, items: Sequence[Instruction]):
    """``(input_ids, labels)`` of prompt + response, loss on the response tokens only (equal lengths)."""
    import torch

    from .datasets import format_chat

    ids, labels = [], []
    for it in items:
        prompt = tokenizer(format_chat(tokenizer, it.text), add_special_tokens=False)["input_ids"]
        reply = tokenizer(" " + response(it) + " <eos>", add_special_tokens=False)
        reply = reply["input_ids"]
        ids.append(prompt + reply)
        labels.append([-100] * len(prompt) + reply)
    width = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id
    ids = [x + [pad] * (width - len(x)) for x in ids]
    labels = [x + [-100] * (width - len(x)) for x in labels]
    return torch.tensor(ids), torch.tensor(labels)


def response(item: Instruction) -> str:
    """The trained answer: ``"<category> : I cannot help with that ."`` for a harmful request (the refusal names
    its category first, so the end-of-instruction positions must carry the category), else :data:`COMPLIANCE`."""
    return REFUSAL.format(category=item.category) if item.harmful else COMPLIANCE


def refusal_tokens(tokenizer) -> list[int]:
    """Ids of the first tokens of the refusals (the category names): pass them as ``refusal_tokens`` to
    ``steering.refusal`` and ``steering.repit`` (their default refusal openers do not apply to this model)."""
    return [int(i) for i in tokenizer.convert_tokens_to_ids(list(HARMFUL_CATEGORIES))]


def first_token_accuracy(model, tokenizer, items: Sequence[Instruction]) -> dict[str, float]:
    """Share of prompts whose most likely first response token is exactly the trained one (the category name
    or ``Sure``), overall, and the refusal rates (a refusal token first) of harmful / harmless prompts."""
    import torch

    from .datasets import format_chat

    enc = tokenizer([format_chat(tokenizer, it.text) for it in items], add_special_tokens=False,
                    return_tensors="pt")
    with torch.no_grad():
        pred = model(input_ids=enc["input_ids"]).logits[:, -1].argmax(-1)
    want = torch.tensor([tokenizer.convert_tokens_to_ids(response(it).split()[0]) for it in items])
    refused = torch.isin(pred, torch.tensor(refusal_tokens(tokenizer)))
    truth = torch.tensor([it.harmful for it in items])
    return {"accuracy": float((pred == want).float().mean()),
            "harmful_refused": float(refused[truth].float().mean()),
            "harmless_refused": float(refused[~truth].float().mean())}


def _stream_batch(rng: random.Random, n: int, exclude: set[str]) -> list[Instruction]:
    """``n`` fresh training requests (half harmful, categories and harmless kinds uniform), none in ``exclude``."""
    out = []
    while len(out) < n:
        cat = rng.choice(HARMFUL_CATEGORIES)
        harmful = rng.random() < 0.5
        text = _sample(rng, cat, "harmful" if harmful else rng.choice(HARMLESS_KINDS))
        if text not in exclude:
            out.append(Instruction(text=text, category=cat if harmful else "harmless", harmful=harmful,
                                   split="train"))
    return out


def build_toy_refusal(out: Path, params: Mapping[str, Any]) -> dict:
    """Train the toy refusal model and save it with its tokenizer (raises if it does not learn the rule)."""
    from ._util import torch_threads

    cfg = ToyRefusalConfig.from_params(params)
    with torch_threads(cfg.num_threads):
        return _train(out, cfg)


def _train(out: Path, cfg: ToyRefusalConfig) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..progress import progress
    from ._util import quiet_transformers, warmup_cosine_schedule

    torch.manual_seed(cfg.seed)
    tok = make_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=cfg.d_model, intermediate_size=cfg.d_mlp,
                         num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                         num_key_value_heads=cfg.n_heads, max_position_embeddings=64,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
    with quiet_transformers():
        model = LlamaForCausalLM(config)
    for i in cfg.attention_only_layers:
        mlp = model.model.layers[i].mlp
        torch.nn.init.zeros_(mlp.down_proj.weight)
        mlp.requires_grad_(False)
    held_out = {x.text for x in instructions() if x.split != "train"}
    rng = random.Random(f"toy-refusal/train/{cfg.seed}")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    sched = warmup_cosine_schedule(opt, cfg.warmup, cfg.steps)
    model.train()
    losses = []
    for _ in progress(range(cfg.steps), desc="toy-refusal: training", total=cfg.steps):
        ids, labels = _encode(tok, _stream_batch(rng, cfg.batch_size, held_out))
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    model.eval()
    metrics = {f"test_{k}": v for k, v in first_token_accuracy(model, tok, instructions("test")).items()}
    if not metrics["test_accuracy"] >= cfg.min_accuracy:
        raise RuntimeError(f"toy-refusal training did not learn the rule: held-out first-token accuracy "
                           f"{metrics['test_accuracy']:.3f} (need >= {cfg.min_accuracy}); metrics {metrics}")
    with quiet_transformers():
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
    metrics.update(final_train_loss=sum(losses[-50:]) / 50, n_params=sum(p.numel() for p in model.parameters()))
    return metrics


__all__ = ["HARMFUL_CATEGORIES", "TOPICS", "INTENT", "FILLER", "REFUSAL", "COMPLIANCE", "response", "refusal_tokens", "ToyRefusalData",
           "ToyRefusalConfig", "instructions", "make_tokenizer", "first_token_accuracy", "build_toy_refusal",
           "vocabulary"]
