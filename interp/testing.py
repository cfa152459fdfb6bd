"""Tiny randomly initialised models of every supported architecture, built offline from configs.

Used by the test suite and handy for trying the API without weights: ``tiny_model("llama")`` returns
``(hf_model, tokenizer)``; text models share a byte-level tokenizer (259 tokens).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch

ARCHITECTURES = ("gpt2", "gpt_neox", "llama", "mistral", "qwen2", "gemma", "gemma2", "bert", "vit", "dinov2", "esm")
VOCAB = 259  # 256 byte symbols + bos, eos, pad


def tiny_tokenizer(folder: str | Path | None = None):
    """A byte-level BPE tokenizer with no merges: one token per byte, plus bos/eos/pad."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}
    for special in ("<|bos|>", "<|eos|>", "<|pad|>"):
        vocab[special] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|bos|>", eos_token="<|eos|>",
                                  pad_token="<|pad|>")
    folder = Path(folder or tempfile.mkdtemp(prefix="interp-tok-"))
    tok.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def tiny_config(arch: str, n_layers: int = 2, d_model: int = 64, n_heads: int = 4):
    import transformers as T

    common = dict(num_hidden_layers=n_layers, hidden_size=d_model, num_attention_heads=n_heads)
    if arch == "gpt2":
        return T.GPT2Config(n_layer=n_layers, n_embd=d_model, n_head=n_heads, vocab_size=VOCAB, n_positions=128,
                            bos_token_id=256, eos_token_id=257, architectures=["GPT2LMHeadModel"])
    if arch == "gpt_neox":
        return T.GPTNeoXConfig(**common, intermediate_size=4 * d_model, vocab_size=VOCAB, max_position_embeddings=128,
                               rotary_pct=0.25, bos_token_id=256, eos_token_id=257, architectures=["GPTNeoXForCausalLM"])
    llama_like = dict(**common, num_key_value_heads=max(1, n_heads // 2), intermediate_size=2 * d_model,
                      vocab_size=VOCAB, max_position_embeddings=128, bos_token_id=256, eos_token_id=257,
                      pad_token_id=258)
    if arch == "llama":
        return T.LlamaConfig(**llama_like, architectures=["LlamaForCausalLM"])
    if arch == "mistral":
        return T.MistralConfig(**llama_like, architectures=["MistralForCausalLM"])
    if arch == "qwen2":
        return T.Qwen2Config(**llama_like, architectures=["Qwen2ForCausalLM"])
    if arch == "gemma":
        return T.GemmaConfig(**llama_like, head_dim=d_model // n_heads, architectures=["GemmaForCausalLM"])
    if arch == "gemma2":
        return T.Gemma2Config(**llama_like, head_dim=d_model // n_heads, architectures=["Gemma2ForCausalLM"])
    if arch == "bert":
        return T.BertConfig(**common, intermediate_size=4 * d_model, vocab_size=VOCAB, max_position_embeddings=128,
                            pad_token_id=258, architectures=["BertForMaskedLM"])
    if arch == "esm":  # ESM-2 layout: rotary, pre-norm, token dropout, final emb_layer_norm_after
        return T.EsmConfig(**common, intermediate_size=4 * d_model, vocab_size=VOCAB, max_position_embeddings=128,
                           position_embedding_type="rotary", token_dropout=True, emb_layer_norm_before=False,
                           pad_token_id=258, mask_token_id=257, architectures=["EsmForMaskedLM"])
    if arch == "vit":
        return T.ViTConfig(**common, intermediate_size=4 * d_model, image_size=32, patch_size=8,
                           num_labels=10, architectures=["ViTForImageClassification"])
    if arch == "dinov2":
        return T.Dinov2Config(**common, image_size=32, patch_size=8, architectures=["Dinov2Model"])
    raise ValueError(f"unknown architecture {arch!r}; choose from {', '.join(ARCHITECTURES)}")


def tiny_model(arch: str, seed: int = 0, folder: str | Path | None = None, perturb_norms: bool = False, **kwargs):
    """``(hf_model, tokenizer)`` for ``arch``, saved to ``folder`` (a temp dir by default) so it can be
    reloaded with ``from_pretrained`` / ``interp.load(folder)``. Vision models return ``tokenizer=None``.

    ``perturb_norms=True`` gives every normalisation layer weights ``1 + 0.5 N(0, 1)`` and biases
    ``0.3 N(0, 1)`` (and layer scales ``1 + 0.5 N(0, 1)``), so that a hook read before or after a norm's
    weight, or with a forgotten bias, shows up as a difference (random init leaves them at 1 and 0)."""
    import transformers as T

    cfg = tiny_config(arch, **kwargs)
    torch.manual_seed(seed)
    cls = getattr(T, cfg.architectures[0])
    model = cls(cfg).eval()
    if perturb_norms:
        g = torch.Generator().manual_seed(seed + 1000)
        with torch.no_grad():
            for name, mod in model.named_modules():
                kind = type(mod).__name__.lower()
                if "norm" in kind or "layerscale" in kind or "layer_scale" in name:
                    for pname, p in mod.named_parameters(recurse=False):
                        if p.dim() == 1:
                            base = 0.0 if (pname == "bias" or kind.startswith("gemma")) else 1.0
                            scale = 0.3 if pname == "bias" else 0.5
                            p.copy_(base + scale * torch.randn(p.shape, generator=g))
    folder = Path(folder or tempfile.mkdtemp(prefix=f"interp-tiny-{arch}-"))
    model.save_pretrained(folder)
    model.config._name_or_path = str(folder)
    tok = None if arch in ("vit", "dinov2") else tiny_tokenizer(folder)
    return model, tok
