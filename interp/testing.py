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


# ------------------------------------------------------------------------------------ causal-LM families
def _family_configs(n_layers: int, d: int, h: int, kv: int) -> dict:
    """Keyword builders of a tiny config per causal-LM family (and layout variant) that ``transformers`` ships.

    Grouped-query attention (``kv`` key/value heads) wherever the family has it; the variants cover the
    other weight layouts: Falcon's new (grouped, fused ``[q.. k v]`` per group), multi-query and
    per-head-interleaved layouts, GPT-BigCode multi-query and multi-head."""
    ids = dict(vocab_size=VOCAB, bos_token_id=256, eos_token_id=257, pad_token_id=258)
    llama = dict(num_hidden_layers=n_layers, hidden_size=d, num_attention_heads=h, num_key_value_heads=kv,
                 intermediate_size=2 * d, max_position_embeddings=128, **ids)
    gpt = dict(n_layer=n_layers, n_embd=d, n_head=h, n_positions=128, **ids)
    falcon = dict(num_hidden_layers=n_layers, hidden_size=d, num_attention_heads=h, max_position_embeddings=128, **ids)
    return {
        "gpt2": ("GPT2Config", "GPT2LMHeadModel", gpt),
        "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                     dict(num_hidden_layers=n_layers, hidden_size=d, num_attention_heads=h, intermediate_size=4 * d,
                          max_position_embeddings=128, rotary_pct=0.25, **ids)),
        "gpt_neox_sequential": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                                dict(num_hidden_layers=n_layers, hidden_size=d, num_attention_heads=h,
                                     intermediate_size=4 * d, max_position_embeddings=128, rotary_pct=0.5,
                                     use_parallel_residual=False, **ids)),
        "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(gpt, rotary_dim=d // h // 2)),
        "gpt_neo": ("GPTNeoConfig", "GPTNeoForCausalLM",
                    dict(num_layers=n_layers, hidden_size=d, num_heads=h, max_position_embeddings=128,
                         attention_types=[[["global", "local"], n_layers // 2]] + [[["global"], n_layers % 2]] * (n_layers % 2),
                         window_size=4, **ids)),
        "opt": ("OPTConfig", "OPTForCausalLM",
                dict(num_hidden_layers=n_layers, hidden_size=d, num_attention_heads=h, ffn_dim=4 * d,
                     max_position_embeddings=128, word_embed_proj_dim=d, **ids)),
        "bloom": ("BloomConfig", "BloomForCausalLM", dict(n_layer=n_layers, hidden_size=d, n_head=h, **ids)),
        "falcon": ("FalconConfig", "FalconForCausalLM",
                   dict(falcon, new_decoder_architecture=True, num_kv_heads=kv, parallel_attn=True, bias=False)),
        "falcon_mq": ("FalconConfig", "FalconForCausalLM",
                      dict(falcon, new_decoder_architecture=False, multi_query=True, parallel_attn=True, bias=False)),
        "falcon_rw": ("FalconConfig", "FalconForCausalLM",
                      dict(falcon, new_decoder_architecture=False, multi_query=False, parallel_attn=False,
                           alibi=True, bias=True)),
        "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", dict(gpt, multi_query=True)),
        "gpt_bigcode_mha": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", dict(gpt, multi_query=False)),
        "codegen": ("CodeGenConfig", "CodeGenForCausalLM", dict(gpt, n_ctx=128, rotary_dim=d // h // 2)),
        "llama": ("LlamaConfig", "LlamaForCausalLM", llama),
        "mistral": ("MistralConfig", "MistralForCausalLM", dict(llama, sliding_window=4)),
        "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(llama, num_local_experts=4, num_experts_per_tok=2)),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", llama),
        "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                      dict(llama, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=d,
                           shared_expert_intermediate_size=d)),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(llama, head_dim=d // h)),
        "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(llama, head_dim=d // h)),
        "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(llama, head_dim=d // h, sliding_window=4)),
        "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(llama, head_dim=d // h, sliding_window=4)),
        "phi": ("PhiConfig", "PhiForCausalLM", dict(llama, num_key_value_heads=h)),
        "phi3": ("Phi3Config", "Phi3ForCausalLM", llama),
        "olmo": ("OlmoConfig", "OlmoForCausalLM", llama),
        "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", llama),
        "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", dict(llama, sliding_window=4)),
        "granite": ("GraniteConfig", "GraniteForCausalLM",
                    dict(llama, embedding_multiplier=3.0, residual_multiplier=0.3, attention_multiplier=0.2,
                         logits_scaling=2.5)),
        "cohere": ("CohereConfig", "CohereForCausalLM", dict(llama, logit_scale=0.5)),
        "stablelm": ("StableLmConfig", "StableLmForCausalLM", llama),
        "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", llama),
        "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(llama, no_rope_layer_interval=2)),
    }


#: causal-LM families (and layout variants) of :func:`tiny_causal_lm`, each one ``transformers`` ships
CAUSAL_LM_FAMILIES = tuple(_family_configs(3, 64, 4, 2))


def tiny_causal_lm(family: str, seed: int = 0, n_layers: int = 3, d_model: int = 64, n_heads: int = 4,
                   n_kv_heads: int = 2, peaked: float = 1.0, perturb_norms: bool = True, dtype=torch.float32,
                   **overrides):
    """A tiny randomly initialised ``transformers`` causal LM of ``family`` (see :data:`CAUSAL_LM_FAMILIES`),
    built in memory: ``config.architectures`` is None, as for any freshly built model.

    ``peaked`` multiplies the query and key weights (attention logits grow with its square), so attention is
    peaked and a wrong mask, scale or head order changes the output visibly; ``perturb_norms`` gives norm
    weights ``1 + 0.5 N(0, 1)`` and biases ``0.3 N(0, 1)``; ``overrides`` go to the config."""
    import transformers as T

    table = _family_configs(n_layers, d_model, n_heads, n_kv_heads)
    if family not in table:
        raise ValueError(f"unknown family {family!r}; choose from {', '.join(table)}")
    cfg_name, model_name, kwargs = table[family]
    cfg = getattr(T, cfg_name)(**{**kwargs, **overrides})
    if hasattr(cfg, "_attn_implementation"):
        cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(T, model_name)(cfg).to(dtype).eval()
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, mod in model.named_modules():
            kind = type(mod).__name__.lower()
            if perturb_norms and ("norm" in kind or "layerscale" in kind):
                for pname, p in mod.named_parameters(recurse=False):
                    if p.dim() >= 1:
                        base = 0.0 if (pname == "bias" or kind.startswith("gemma")) else 1.0
                        scale = 0.3 if pname == "bias" else 0.5
                        p.copy_(base + scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
            leaf = name.rsplit(".", 1)[-1]
            if peaked != 1.0 and leaf in ("q_proj", "k_proj", "query", "key", "c_attn", "query_key_value",
                                          "qkv_proj", "Wqkv"):
                mod.weight.mul_(peaked)
    return model
