"""TransformerLens's public demos, cell by cell, as a TransformerLens user writes them (issue #44).

Each demo below is the list of its code cells that fit a CPU without internet (written here after reading TL's
``demos/Main_Demo.ipynb``, ``Activation_Patching_in_TL_Demo.ipynb`` and ``Attribution_Patching_Demo.ipynb`` and ``Direct_Logit_Attribution_Demo.ipynb``; the
Exploratory Analysis Demo has its own test, ``tests/test_tl_demo_verbatim.py``). Only the loading line differs: the
demos load GPT-2 from the hub, here a 3-layer model built offline (GPT-2 with LayerNorm biases and learned
positions; grouped-query Llama), and GPT-2-sized constants (layer 5 head 5, 12 heads) become the tiny model's.
Plotting cells are left out (``imshow`` of a tensor is not interp's API); what they plot is kept as a number.

Every cell runs, unchanged, on an interp model of each backend (with ``interp.utils`` / ``interp.patching``)
and on the TransformerLens bridge of the same weights (with ``transformer_lens.utils`` / ``.patching`` and
TL's own ``ActivationCache``); every number a cell computes agrees. :data:`COUNTS` holds the cells per demo
(reported in docs/for_transformer_lens_users.md). The reference is the bridge of the same loading as interp's (no
weight processing: interp never folds), also for the Direct Logit Attribution Demo, whose ``apply_ln`` is TL's
(the cached scale, without the norm's weight, which TL leaves to ``fold_ln``).
"""
from __future__ import annotations

import functools
import warnings
from functools import partial
from typing import Any, Callable

import pytest
import torch

import interp
from interp.testing import tiny_model

BACKENDS = ("torch", "nnsight", "transformer_lens")
Cell = Callable[[dict], None]


# ------------------------------------------------------------------------------------------------- Main Demo
def main_loss(ns):
    model = ns["model"]
    model_description_text = "## Loading and Running Models. To try the model out, let's find the loss on this text!"
    loss = model(model_description_text, return_type="loss")
    ns["out"]["loss"] = loss


def main_cache(ns):
    model = ns["model"]
    gpt2_text = "Natural language processing tasks, such as question answering."
    gpt2_tokens = model.to_tokens(gpt2_text)
    gpt2_logits, gpt2_cache = model.run_with_cache(gpt2_tokens, remove_batch_dim=True)
    attention_pattern = gpt2_cache["pattern", 0, "attn"]
    gpt2_str_tokens = model.to_str_tokens(gpt2_text)
    ns.update(gpt2_text=gpt2_text, gpt2_tokens=gpt2_tokens, attention_pattern=attention_pattern)
    ns["out"]["pattern0"] = attention_pattern
    ns["out"]["str_tokens"] = gpt2_str_tokens


def main_stop_at_layer(ns):
    model, utils = ns["model"], ns["utils"]
    attn_hook_name = "blocks.0.attn.hook_pattern"
    attn_layer = 0
    _, gpt2_attn_cache = model.run_with_cache(ns["gpt2_tokens"], remove_batch_dim=True, stop_at_layer=attn_layer + 1,
                                              names_filter=[attn_hook_name])
    gpt2_attn = gpt2_attn_cache[attn_hook_name]
    assert torch.allclose(gpt2_attn, ns["attention_pattern"])


def main_head_ablation(ns):
    model, utils = ns["model"], ns["utils"]
    layer_to_ablate = 0
    head_index_to_ablate = 1
    shapes = []

    def head_ablation_hook(value, hook):
        shapes.append(value.shape)
        value[:, :, head_index_to_ablate, :] = 0.0
        return value

    original_loss = model(ns["gpt2_tokens"], return_type="loss")
    ablated_loss = model.run_with_hooks(ns["gpt2_tokens"], return_type="loss",
                                        fwd_hooks=[(utils.get_act_name("v", layer_to_ablate), head_ablation_hook)])
    ns["out"]["ablation"] = torch.stack([original_loss, ablated_loss])
    ns["out"]["v_shape"] = list(shapes[0])


def main_ioi_patching(ns):
    model, utils = ns["model"], ns["utils"]
    clean_prompt = "After J and M went to the store, M gave a bottle to"
    corrupted_prompt = "After J and M went to the store, J gave a bottle to"
    clean_tokens = model.to_tokens(clean_prompt)
    corrupted_tokens = model.to_tokens(corrupted_prompt)

    def logits_to_logit_diff(logits, correct_answer="J", incorrect_answer="M"):
        correct_index = model.to_single_token(correct_answer)
        incorrect_index = model.to_single_token(incorrect_answer)
        return logits[0, -1, correct_index] - logits[0, -1, incorrect_index]

    clean_logits, clean_cache = model.run_with_cache(clean_tokens)
    clean_logit_diff = logits_to_logit_diff(clean_logits)
    corrupted_logits = model(corrupted_tokens)
    corrupted_logit_diff = logits_to_logit_diff(corrupted_logits)

    def residual_stream_patching_hook(resid_pre, hook, position):
        clean_resid_pre = clean_cache[hook.name]
        resid_pre[:, position, :] = clean_resid_pre[:, position, :]
        return resid_pre

    num_positions = len(clean_tokens[0])
    ioi_patching_result = torch.zeros((model.cfg.n_layers, num_positions), device=model.cfg.device)
    for layer in range(model.cfg.n_layers):
        for position in range(0, num_positions, 9):
            temp_hook_fn = partial(residual_stream_patching_hook, position=position)
            patched_logits = model.run_with_hooks(corrupted_tokens, fwd_hooks=[
                (utils.get_act_name("resid_pre", layer), temp_hook_fn)])
            patched_logit_diff = logits_to_logit_diff(patched_logits).detach()
            ioi_patching_result[layer, position] = (patched_logit_diff - corrupted_logit_diff) / (
                clean_logit_diff - corrupted_logit_diff)
    token_labels = [f"{token}_{index}" for index, token in enumerate(model.to_str_tokens(clean_tokens))]
    ns["out"]["ioi_patching"] = ioi_patching_result
    ns["out"]["token_labels"] = token_labels


def main_induction_loss(ns):
    import einops

    model = ns["model"]
    batch_size, seq_len = 3, 12
    torch.manual_seed(0)
    random_tokens = torch.randint(10, 250, (batch_size, seq_len)).to(model.cfg.device)
    repeated_tokens = einops.repeat(random_tokens, "batch seq_len -> batch (2 seq_len)")
    repeated_logits = model(repeated_tokens)
    correct_log_probs = model.loss_fn(repeated_logits, repeated_tokens, per_token=True)
    loss_by_position = einops.reduce(correct_log_probs, "batch position -> position", "mean")
    ns.update(repeated_tokens=repeated_tokens, seq_len=seq_len)
    ns["out"]["loss_by_position"] = loss_by_position


def main_induction_scores(ns):
    import einops

    model, seq_len = ns["model"], ns["seq_len"]
    induction_score_store = torch.zeros((model.cfg.n_layers, model.cfg.n_heads), device=model.cfg.device)

    def induction_score_hook(pattern, hook):
        induction_stripe = pattern.diagonal(dim1=-2, dim2=-1, offset=1 - seq_len)
        induction_score = einops.reduce(induction_stripe, "batch head_index position -> head_index", "mean")
        induction_score_store[hook.layer(), :] = induction_score

    pattern_hook_names_filter = lambda name: name.endswith("pattern")  # noqa: E731
    model.run_with_hooks(ns["repeated_tokens"], return_type=None,
                         fwd_hooks=[(pattern_hook_names_filter, induction_score_hook)])
    ns["out"]["induction_scores"] = induction_score_store


def main_pattern_of_one_head(ns):
    model, utils = ns["model"], ns["utils"]
    induction_head_layer, induction_head_index = 2, 1
    seen = []

    def visualize_pattern_hook(pattern, hook):
        seen.append((model.to_str_tokens(ns["repeated_tokens"][0]), pattern[0, induction_head_index, :, :]))

    model.run_with_hooks(ns["repeated_tokens"][:1], return_type=None,
                         fwd_hooks=[(utils.get_act_name("pattern", induction_head_layer), visualize_pattern_hook)])
    ns["out"]["one_head_pattern"] = seen[0][1]


def main_tl_named_parameters(ns):
    model = ns["model"]
    shapes = {}
    for name, param in model.tl_named_parameters():
        if name.startswith("blocks.0.") or not name.startswith("blocks"):
            shapes[name] = list(param.shape)
    ns["out"]["param_shapes"] = {k: v for k, v in shapes.items() if k in ns["shared_params"]}


def main_hook_names_and_shapes(ns):
    model = ns["model"]
    printed = []

    def print_name_shape_hook_function(activation, hook):
        printed.append((hook.name, tuple(activation.shape)))

    not_in_late_block_filter = lambda name: name.startswith("blocks.0.") or not name.startswith("blocks")  # noqa: E731
    model.run_with_hooks("The quick brown fox", return_type=None,
                         fwd_hooks=[(not_in_late_block_filter, print_name_shape_hook_function)])
    ns["out"]["printed_shapes"] = dict(printed).get("blocks.0.attn.hook_pattern")


def main_unembed_bias(ns):
    model = ns["model"]
    unembed_bias = model.unembed.b_U
    bias_values, bias_indices = unembed_bias.sort(descending=True)
    top = [f"{bias_values[i].item():.2f} {model.to_string(bias_indices[i])!r}" for i in range(5)]
    john_bias = model.unembed.b_U[model.to_single_token("J")]
    mary_bias = model.unembed.b_U[model.to_single_token("M")]
    ns["out"]["bias_ratio"] = torch.exp(john_bias - mary_bias)
    ns["out"]["top_bias"] = top


def main_tokens(ns):
    model = ns["model"]
    example_text = "The first thing you need to figure out is *how* things are tokenized."
    example_text_str_tokens = model.to_str_tokens(example_text)
    example_text_tokens = model.to_tokens(example_text)
    example_multi_text = ["The cat sat on the mat.", "The cat sat on the mat really hard."]
    example_multi_text_tokens = model.to_tokens(example_multi_text)
    cat_logits = model("The cat sat on the mat.")
    cat_probs = cat_logits.softmax(dim=-1)
    capital_the_token_index = model.to_single_token("T")
    ns["out"]["tokens"] = [example_text_str_tokens, example_text_tokens, example_multi_text_tokens]
    ns["out"]["cat_prob"] = cat_probs[0, -1, capital_the_token_index]
    ns["out"]["to_string"] = [model.to_string(100), model.to_string(example_text_tokens.squeeze())]
    ns["out"]["digits"] = [model.to_str_tokens("2342+2017=21445"), model.to_str_tokens("1000+1000000=999999")]


def main_token_positions(ns):
    model = ns["model"]
    ns["out"]["positions"] = [
        model.get_token_position("c", "The cat sat on the mat"),
        model.get_token_position("c", "The cat sat on the mat", prepend_bos=False),
        model.get_token_position("c", "The cat sat on the mat. The mat sat on the cat.", mode="first"),
        model.get_token_position("c", "The cat sat on the mat. The mat sat on the cat.", mode="last")]


def main_bos(ns):
    model = ns["model"]
    shapes = [model("Hello World").shape, model("Hello World", prepend_bos=True).shape,
              model("Hello World", prepend_bos=False).shape]
    with_bos = model("Claire and Mary went to the shops, then Mary gave to", prepend_bos=True)
    without_bos = model("Claire and Mary went to the shops, then Mary gave to", prepend_bos=False)
    m, c = model.to_single_token("M"), model.to_single_token("C")
    ns["out"]["bos_shapes"] = [list(s) for s in shapes[1:]]
    ns["out"]["bos_logit_diffs"] = torch.stack([with_bos[0, -1, c] - with_bos[0, -1, m],
                                                without_bos[0, -1, c] - without_bos[0, -1, m]])
    ns["out"]["str_tokens_no_bos"] = model.to_str_tokens("Claire", prepend_bos=False)


def main_ov_copying(ns):
    model = ns["model"]
    OV_circuit_all_heads = model.OV
    OV_circuit_all_heads_eigenvalues = OV_circuit_all_heads.eigenvalues
    OV_copying_score = OV_circuit_all_heads_eigenvalues.sum(dim=-1).real / \
        OV_circuit_all_heads_eigenvalues.abs().sum(dim=-1)
    full_OV_circuit = model.embed.W_E @ OV_circuit_all_heads @ model.unembed.W_U
    full_OV_circuit_eigenvalues = full_OV_circuit.eigenvalues
    full_OV_copying_score = full_OV_circuit_eigenvalues.sum(dim=-1).real / \
        full_OV_circuit_eigenvalues.abs().sum(dim=-1)
    ns["out"]["ov_copying"] = OV_copying_score
    ns["out"]["full_ov_copying"] = full_OV_copying_score


def main_generate(ns):
    model = ns["model"]
    out = model.generate("(CNN) President Obama caught in", max_new_tokens=5, temperature=0.7)
    assert out  # sampled text: the format differs (interp: the continuations, TL: prompt + continuation)


MAIN_DEMO: list[Cell] = [main_loss, main_cache, main_stop_at_layer, main_head_ablation, main_ioi_patching,
                         main_induction_loss, main_induction_scores, main_pattern_of_one_head, main_tl_named_parameters,
                         main_hook_names_and_shapes, main_unembed_bias, main_tokens, main_token_positions, main_bos,
                         main_ov_copying, main_generate]


# ----------------------------------------------------------------------------------- Activation Patching Demo
# short prompts (the tiny tokenizer is byte-level: one token per character): TL's patching runs one forward per patch
PROMPTS = ["When J and M, J to", "When J and M, M to", "When T and A, A to", "When T and A, T to"]
ANSWERS = [("M", "J"), ("J", "M"), ("T", "A"), ("A", "T")]


def ap_setup(ns):
    model = ns["model"]
    prompts, answers = PROMPTS, ANSWERS
    clean_tokens = model.to_tokens(prompts)
    corrupted_tokens = clean_tokens[[(i + 1 if i % 2 == 0 else i - 1) for i in range(len(clean_tokens))]]
    strings = (model.to_string(clean_tokens[0]), model.to_string(corrupted_tokens[0]))
    answer_token_indices = torch.tensor([[model.to_single_token(answers[i][j]) for j in range(2)]
                                         for i in range(len(answers))], device=model.cfg.device)
    ns.update(clean_tokens=clean_tokens, corrupted_tokens=corrupted_tokens, answer_token_indices=answer_token_indices)
    ns["out"]["strings"] = list(strings)


def ap_baselines(ns):
    model, answer_token_indices = ns["model"], ns["answer_token_indices"]

    def get_logit_diff(logits, answer_token_indices=answer_token_indices):
        if len(logits.shape) == 3:
            logits = logits[:, -1, :]
        correct_logits = logits.gather(1, answer_token_indices[:, 0].unsqueeze(1))
        incorrect_logits = logits.gather(1, answer_token_indices[:, 1].unsqueeze(1))
        return (correct_logits - incorrect_logits).mean()

    clean_logits, clean_cache = model.run_with_cache(ns["clean_tokens"])
    corrupted_logits, corrupted_cache = model.run_with_cache(ns["corrupted_tokens"])
    clean_logit_diff = get_logit_diff(clean_logits, answer_token_indices).item()
    corrupted_logit_diff = get_logit_diff(corrupted_logits, answer_token_indices).item()
    CLEAN_BASELINE, CORRUPTED_BASELINE = clean_logit_diff, corrupted_logit_diff

    def ioi_metric(logits, answer_token_indices=answer_token_indices):
        return (get_logit_diff(logits, answer_token_indices) - CORRUPTED_BASELINE) / (CLEAN_BASELINE - CORRUPTED_BASELINE)

    ns.update(clean_cache=clean_cache, corrupted_cache=corrupted_cache, ioi_metric=ioi_metric,
              get_logit_diff=get_logit_diff, clean_logits=clean_logits, corrupted_logits=corrupted_logits)
    ns["out"]["baselines"] = torch.tensor([clean_logit_diff, corrupted_logit_diff, ioi_metric(clean_logits).item(),
                                           ioi_metric(corrupted_logits).item()])


def _patching(name: str, *post: Callable) -> Cell:
    def cell(ns):
        fn = getattr(ns["patching"], name)
        result = fn(ns["model"], ns["corrupted_tokens"], ns["clean_cache"], ns["ioi_metric"])
        for p in post:
            result = p(result)
        ns["out"][name] = result
    cell.__name__ = f"ap_{name}"
    return cell


def _by_pos_rearranged(result):
    import einops
    return einops.rearrange(result, "layer pos head -> (layer head) pos")


def ap_induction_setup(ns):  # TL's cells 18-20: attn-only-2l becomes the tiny model (the loading line)
    attn_only = ns["model"]
    batch = 4
    seq_len = 6  # 20 in TL's demo: TL's by-position patching runs one forward per position and head
    torch.manual_seed(0)
    rand_tokens_A = torch.randint(10, 250, (batch, seq_len)).to(attn_only.cfg.device)  # (100, 10000): GPT-2's vocab
    rand_tokens_B = torch.randint(10, 250, (batch, seq_len)).to(attn_only.cfg.device)
    rand_tokens_C = torch.randint(10, 250, (batch, seq_len)).to(attn_only.cfg.device)
    bos = torch.tensor([attn_only.tokenizer.bos_token_id] * batch)[:, None].to(attn_only.cfg.device)
    clean_tokens_induction = torch.cat([bos, rand_tokens_A, rand_tokens_A], dim=1).to(attn_only.cfg.device)
    corrupted_tokens_induction = torch.cat([bos, rand_tokens_A, rand_tokens_B], dim=1).to(attn_only.cfg.device)
    clean_logits_induction, clean_cache_induction = attn_only.run_with_cache(clean_tokens_induction)
    corrupted_logits_induction, corrupted_cache_induction = attn_only.run_with_cache(corrupted_tokens_induction)

    def induction_loss(logits, answer_token_indices=rand_tokens_A):
        seq_len = answer_token_indices.shape[1]
        final_logits = logits[:, -seq_len:-1]
        final_log_probs = final_logits.log_softmax(-1)
        return final_log_probs.gather(-1, answer_token_indices[:, 1:].unsqueeze(-1)).mean()

    CLEAN_BASELINE_INDUCTION = induction_loss(clean_logits_induction).item()
    CORRUPTED_BASELINE_INDUCTION = induction_loss(corrupted_logits_induction).item()
    ns.update(attn_only=attn_only, bos=bos, rand_tokens_A=rand_tokens_A, rand_tokens_B=rand_tokens_B,
              rand_tokens_C=rand_tokens_C, clean_cache_induction=clean_cache_induction,
              corrupted_tokens_induction=corrupted_tokens_induction, induction_loss=induction_loss)
    ns["out"]["induction_baselines"] = torch.tensor([CLEAN_BASELINE_INDUCTION, CORRUPTED_BASELINE_INDUCTION])


def ap_induction_patching(ns):  # TL's cell 21
    import einops

    patching, attn_only = ns["patching"], ns["attn_only"]
    every_head_all_pos_act_patch_result = patching.get_act_patch_attn_head_all_pos_every(
        attn_only, ns["corrupted_tokens_induction"], ns["clean_cache_induction"], ns["induction_loss"])
    every_head_act_patch_result = patching.get_act_patch_attn_head_by_pos_every(
        attn_only, ns["corrupted_tokens_induction"], ns["clean_cache_induction"], ns["induction_loss"])
    every_head_act_patch_result = einops.rearrange(every_head_act_patch_result,
                                                   "act_type layer pos head -> act_type (layer head) pos")
    ns["out"]["induction_all_pos_every"] = every_head_all_pos_act_patch_result
    ns["out"]["induction_by_pos_every"] = every_head_act_patch_result


def ap_induction_other_baselines(ns):  # TL's cells 22-23
    patching, attn_only, bos = ns["patching"], ns["attn_only"], ns["bos"]
    A, B, C = ns["rand_tokens_A"], ns["rand_tokens_B"], ns["rand_tokens_C"]
    corrupted_tokens_induction_BA = torch.cat([bos, B, A], dim=1).to(attn_only.cfg.device)
    corrupted_tokens_induction_BB = torch.cat([bos, B, B], dim=1).to(attn_only.cfg.device)
    corrupted_tokens_induction_BC = torch.cat([bos, B, C], dim=1).to(attn_only.cfg.device)
    ns["out"]["induction_other_baselines"] = [
        patching.get_act_patch_attn_head_all_pos_every(attn_only, tokens, ns["clean_cache_induction"],
                                                       ns["induction_loss"])
        for tokens in (corrupted_tokens_induction_BA, corrupted_tokens_induction_BB, corrupted_tokens_induction_BC)]


ACTIVATION_PATCHING_DEMO: list[Cell] = [
    ap_setup, ap_baselines, _patching("get_act_patch_resid_pre"), _patching("get_act_patch_attn_head_out_all_pos"),
    _patching("get_act_patch_attn_head_out_by_pos", _by_pos_rearranged), _patching("get_act_patch_block_every"),
    _patching("get_act_patch_attn_head_all_pos_every"), _patching("get_act_patch_attn_head_by_pos_every"),
    ap_induction_setup, ap_induction_patching, ap_induction_other_baselines]


# ---------------------------------------------------------------------------------- Attribution Patching Demo
def attr_setup(ns):
    ns["model"].set_use_attn_result(True)


def attr_fwd_bwd(ns):  # TL's cell 11 as it is now: run_with_cache, a backward hook, and the bridge workarounds
    from transformer_lens import ActivationCache

    model = ns["model"]
    filter_not_qkv_input = lambda name: "_input" not in name  # noqa: E731

    def _fix_cache_device_and_pos_embed(cache, device):
        """Move run_with_cache tensors back to model device (Bug 5 workaround)
        and expand pos_embed to batch dimension (Bug 3 workaround)."""
        for key in list(cache.cache_dict.keys()):
            val = cache.cache_dict[key]
            if isinstance(val, torch.Tensor):
                cache.cache_dict[key] = val.to(device)
        if "hook_pos_embed" in cache.cache_dict:
            pe = cache.cache_dict["hook_pos_embed"]
            if pe.shape[0] == 1:
                for k, v in cache.cache_dict.items():
                    if k != "hook_pos_embed" and isinstance(v, torch.Tensor) and v.ndim >= 2 and v.shape[0] > 1:
                        cache.cache_dict["hook_pos_embed"] = pe.expand(v.shape[0], -1, -1)
                        break

    def _fix_head_result_cache(cache, model, is_grad=False):
        """Fix hook_result shape for TransformerBridge compatibility."""
        n_heads = model.cfg.n_heads
        for layer in range(model.cfg.n_layers):
            key = f"blocks.{layer}.attn.hook_result"
            if key not in cache.cache_dict:
                continue
            val = cache.cache_dict[key]
            if not isinstance(val, torch.Tensor) or val.ndim != 3:
                continue
            if is_grad:
                cache.cache_dict[key] = val.unsqueeze(-2).expand(*val.shape[:-1], n_heads, val.shape[-1])
            else:
                del cache.cache_dict[key]

    def get_cache_fwd_and_bwd(model, tokens, metric):
        model.reset_hooks()
        device = model.cfg.device
        grad_cache = {}

        def backward_cache_hook(act, hook):
            grad_cache[hook.name] = act.detach()

        model.add_hook(filter_not_qkv_input, backward_cache_hook, "bwd")
        output, fwd_cache = model.run_with_cache(tokens, names_filter=filter_not_qkv_input)
        _fix_cache_device_and_pos_embed(fwd_cache, device)
        value = metric(output)
        value.backward()
        model.reset_hooks()
        for key, hp in model.hook_dict.items():
            if hp.name != key and filter_not_qkv_input(key):
                if hp.name in grad_cache and key not in grad_cache:
                    grad_cache[key] = grad_cache[hp.name]
        grad_act_cache = ActivationCache(grad_cache, model)
        _fix_cache_device_and_pos_embed(grad_act_cache, device)
        _fix_head_result_cache(fwd_cache, model, is_grad=False)
        _fix_head_result_cache(grad_act_cache, model, is_grad=True)
        return value.item(), fwd_cache, grad_act_cache

    with torch.enable_grad():
        clean_value, clean_cache, clean_grad_cache = get_cache_fwd_and_bwd(model, ns["clean_tokens"], ns["ioi_metric"])
        assert abs(clean_value - 1.0) < 1e-5, f"Expected 1.0, got {clean_value}"
        corrupted_value, corrupted_cache, corrupted_grad_cache = get_cache_fwd_and_bwd(
            model, ns["corrupted_tokens"], ns["ioi_metric"])
        assert abs(corrupted_value) < 1e-5, f"Expected 0.0, got {corrupted_value}"
    for p in model.parameters():  # the demo leaves parameter gradients behind; drop them
        p.grad = None
    ns.update(attr_clean_cache=clean_cache, attr_clean_grad_cache=clean_grad_cache,
              attr_corrupted_cache=corrupted_cache, attr_corrupted_grad_cache=corrupted_grad_cache)
    ns["out"]["attr_values"] = torch.tensor([clean_value, corrupted_value])


def attr_attention(ns):
    import einops

    model, clean_cache, clean_grad_cache = ns["model"], ns["attr_clean_cache"], ns["attr_clean_grad_cache"]
    attention_stack = torch.stack([clean_cache["pattern", l] for l in range(model.cfg.n_layers)], dim=0)
    attention_grad_stack = torch.stack([clean_grad_cache["pattern", l] for l in range(model.cfg.n_layers)], dim=0)
    attention_attr = attention_grad_stack * attention_stack
    attention_attr = einops.rearrange(attention_attr, "layer batch head_index dest src -> batch layer head_index dest src")
    ns["attention_attr"] = attention_attr
    ns["out"]["attention_attr"] = attention_attr


def attr_residual(ns):
    import einops

    clean_cache, corrupted_cache, corrupted_grad_cache = (ns["attr_clean_cache"], ns["attr_corrupted_cache"],
                                                          ns["attr_corrupted_grad_cache"])
    clean_residual, residual_labels = clean_cache.accumulated_resid(-1, incl_mid=True, return_labels=True)
    corrupted_residual = corrupted_cache.accumulated_resid(-1, incl_mid=True, return_labels=False)
    corrupted_grad_residual = corrupted_grad_cache.accumulated_resid(-1, incl_mid=True, return_labels=False)
    residual_attr = einops.reduce(corrupted_grad_residual * (clean_residual - corrupted_residual),
                                  "component batch pos d_model -> component pos", "sum")
    ns["out"]["residual_attr"] = residual_attr
    ns["out"]["residual_labels"] = residual_labels


def attr_layer_out(ns):
    import einops

    clean_cache, corrupted_cache, corrupted_grad_cache = (ns["attr_clean_cache"], ns["attr_corrupted_cache"],
                                                          ns["attr_corrupted_grad_cache"])
    clean_layer_out, labels = clean_cache.decompose_resid(-1, return_labels=True)
    corrupted_layer_out = corrupted_cache.decompose_resid(-1, return_labels=False)
    corrupted_grad_layer_out = corrupted_grad_cache.decompose_resid(-1, return_labels=False)
    layer_out_attr = einops.reduce(corrupted_grad_layer_out * (clean_layer_out - corrupted_layer_out),
                                   "component batch pos d_model -> component pos", "sum")
    ns["out"]["layer_out_attr"] = layer_out_attr
    ns["out"]["layer_out_labels"] = labels


def attr_head_out(ns):
    import einops

    clean_cache, corrupted_cache, corrupted_grad_cache = (ns["attr_clean_cache"], ns["attr_corrupted_cache"],
                                                          ns["attr_corrupted_grad_cache"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clean_head_out = clean_cache.stack_head_results(-1, return_labels=False)
        corrupted_head_out = corrupted_cache.stack_head_results(-1, return_labels=False)
        corrupted_grad_head_out = corrupted_grad_cache.stack_head_results(-1, return_labels=False)
    head_out_attr = einops.reduce(corrupted_grad_head_out * (clean_head_out - corrupted_head_out),
                                  "component batch pos d_model -> component pos", "sum")
    ns["head_out_attr"] = head_out_attr
    ns["out"]["head_out_attr"] = head_out_attr


def attr_head_vectors(ns):
    import einops

    model = ns["model"]
    clean_cache, corrupted_cache, corrupted_grad_cache = (ns["attr_clean_cache"], ns["attr_corrupted_cache"],
                                                          ns["attr_corrupted_grad_cache"])

    def stack_head_vector_from_cache(cache, activation_name):
        stacked_head_vectors = torch.stack([cache[activation_name, l] for l in range(model.cfg.n_layers)], dim=0)
        return einops.rearrange(stacked_head_vectors,
                                "layer batch pos head_index d_head -> (layer head_index) batch pos d_head")

    def attr_patch_head_vector(clean_cache, corrupted_cache, corrupted_grad_cache, activation_name):
        clean_head_vector = stack_head_vector_from_cache(clean_cache, activation_name)
        corrupted_head_vector = stack_head_vector_from_cache(corrupted_cache, activation_name)
        corrupted_grad_head_vector = stack_head_vector_from_cache(corrupted_grad_cache, activation_name)
        return einops.reduce(corrupted_grad_head_vector * (clean_head_vector - corrupted_head_vector),
                             "component batch pos d_head -> component pos", "sum")

    for activation_name in ("k", "q", "v", "z"):
        ns["out"][f"attr_head_vector_{activation_name}"] = attr_patch_head_vector(
            clean_cache, corrupted_cache, corrupted_grad_cache, activation_name)


def attr_head_patterns(ns):
    import einops

    model = ns["model"]
    clean_cache, corrupted_cache, corrupted_grad_cache = (ns["attr_clean_cache"], ns["attr_corrupted_cache"],
                                                          ns["attr_corrupted_grad_cache"])

    def stack_head_pattern_from_cache(cache):
        stacked_head_pattern = torch.stack([cache["pattern", l] for l in range(model.cfg.n_layers)], dim=0)
        return einops.rearrange(stacked_head_pattern,
                                "layer batch head_index dest_pos src_pos -> (layer head_index) batch dest_pos src_pos")

    head_pattern_attr = einops.reduce(
        stack_head_pattern_from_cache(corrupted_grad_cache) * (stack_head_pattern_from_cache(clean_cache)
                                                               - stack_head_pattern_from_cache(corrupted_cache)),
        "component batch dest_pos src_pos -> component dest_pos src_pos", "sum")
    ns["out"]["attr_head_pattern"] = head_pattern_attr


def attr_head_names(ns):  # TL's cell 13
    model = ns["model"]
    HEAD_NAMES = [f"L{l}H{h}" for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    HEAD_NAMES_SIGNED = [f"{name}{sign}" for name in HEAD_NAMES for sign in ["+", "-"]]
    HEAD_NAMES_QKV = [f"{name}{act_name}" for name in HEAD_NAMES for act_name in ["Q", "K", "V"]]
    ns.update(HEAD_NAMES=HEAD_NAMES, HEAD_NAMES_SIGNED=HEAD_NAMES_SIGNED, HEAD_NAMES_QKV=HEAD_NAMES_QKV)
    ns["out"]["head_names"] = [HEAD_NAMES[:5], HEAD_NAMES_SIGNED[:5], HEAD_NAMES_QKV[:5]]


def attr_plot_attention_attr(ns):  # TL's cell 14, up to the circuitsvis display: what it would show
    import einops

    model, attention_attr, HEAD_NAMES_SIGNED = ns["model"], ns["attention_attr"], ns["HEAD_NAMES_SIGNED"]

    def plot_attention_attr(attention_attr, tokens, top_k=20, index=0, title=""):
        if len(tokens.shape) == 2:
            tokens = tokens[index]
        if len(attention_attr.shape) == 5:
            attention_attr = attention_attr[index]
        attention_attr_pos = attention_attr.clamp(min=-1e-5)
        attention_attr_neg = -attention_attr.clamp(max=1e-5)
        attention_attr_signed = torch.stack([attention_attr_pos, attention_attr_neg], dim=0)
        attention_attr_signed = einops.rearrange(attention_attr_signed,
                                                 "sign layer head_index dest src -> (layer head_index sign) dest src")
        attention_attr_signed = attention_attr_signed / attention_attr_signed.max()
        attention_attr_indices = attention_attr_signed.max(-1).values.max(-1).values.argsort(descending=True)
        attention_attr_signed = attention_attr_signed[attention_attr_indices, :, :]
        head_labels = [HEAD_NAMES_SIGNED[i.item()] for i in attention_attr_indices]
        return model.to_str_tokens(tokens), attention_attr_signed[:top_k], head_labels[:top_k]

    ns["plot_attention_attr"] = plot_attention_attr
    first = plot_attention_attr(attention_attr, ns["clean_tokens"], index=0, title="first sequence")
    summed = plot_attention_attr(attention_attr.sum(0), ns["clean_tokens"][0], title="all sequences")
    ns["out"]["plot_attention_attr"] = [first[0], first[1], summed[1]]


def attr_head_path(ns):  # TL's cell 20: needs the gradient at ln1.hook_scale
    import einops
    from fancy_einsum import einsum

    model = ns["model"]
    HEAD_NAMES, HEAD_NAMES_QKV = ns["HEAD_NAMES"], ns["HEAD_NAMES_QKV"]
    clean_cache, corrupted_cache, corrupted_grad_cache = (ns["attr_clean_cache"], ns["attr_corrupted_cache"],
                                                          ns["attr_corrupted_grad_cache"])

    def get_head_vector_grad_input_from_grad_cache(grad_cache, activation_name, layer):
        vector_grad = grad_cache[activation_name, layer]
        ln_scales = grad_cache["scale", layer, "ln1"]
        attn_layer_object = model.blocks[layer].attn
        if activation_name == "q":
            W = attn_layer_object.W_Q
        elif activation_name == "k":
            W = attn_layer_object.W_K
        elif activation_name == "v":
            W = attn_layer_object.W_V
        else:
            raise ValueError("Invalid activation name")
        return einsum("batch pos head_index d_head, batch pos, head_index d_model d_head -> batch pos head_index d_model",
                      vector_grad, ln_scales.squeeze(-1), W)

    def get_stacked_head_vector_grad_input(grad_cache, activation_name):
        return torch.stack([get_head_vector_grad_input_from_grad_cache(grad_cache, activation_name, l)
                            for l in range(model.cfg.n_layers)], dim=0)

    def get_full_vector_grad_input(grad_cache):
        return torch.stack([get_stacked_head_vector_grad_input(grad_cache, activation_name)
                            for activation_name in ["q", "k", "v"]], dim=0)

    def attr_patch_head_path(clean_cache, corrupted_cache, corrupted_grad_cache):
        start_labels = HEAD_NAMES
        end_labels = HEAD_NAMES_QKV
        full_vector_grad_input = get_full_vector_grad_input(corrupted_grad_cache)
        clean_head_result_stack = clean_cache.stack_head_results(-1)
        corrupted_head_result_stack = corrupted_cache.stack_head_results(-1)
        diff_head_result = einops.rearrange(
            clean_head_result_stack - corrupted_head_result_stack,
            "(layer head_index) batch pos d_model -> layer batch pos head_index d_model",
            layer=model.cfg.n_layers, head_index=model.cfg.n_heads)
        path_attr = einsum("qkv layer_end batch pos head_end d_model, layer_start batch pos head_start d_model -> "
                           "qkv layer_end head_end layer_start head_start pos", full_vector_grad_input, diff_head_result)
        correct_layer_order_mask = (torch.arange(model.cfg.n_layers)[None, :, None, None, None, None]
                                    > torch.arange(model.cfg.n_layers)[None, None, None, :, None, None]).to(path_attr.device)
        zero = torch.zeros(1, device=path_attr.device)
        path_attr = torch.where(correct_layer_order_mask, path_attr, zero)
        path_attr = einops.rearrange(path_attr, "qkv layer_end head_end layer_start head_start pos -> "
                                                "(layer_end head_end qkv) (layer_start head_start) pos")
        return path_attr, end_labels, start_labels

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        head_path_attr, end_labels, start_labels = attr_patch_head_path(clean_cache, corrupted_cache,
                                                                        corrupted_grad_cache)
    ns.update(head_path_attr=head_path_attr, end_labels=end_labels, start_labels=start_labels)
    ns["out"]["head_path_attr"] = head_path_attr.sum(-1)


def attr_top_head_paths(ns):  # TL's cells 21-23 (22 heads of GPT-2's 144: here the top half of the tiny model's)
    import einops

    head_out_attr, head_path_attr = ns["head_out_attr"], ns["head_path_attr"]
    start_labels, end_labels = ns["start_labels"], ns["end_labels"]
    head_out_values, head_out_indices = head_out_attr.sum(-1).abs().sort(descending=True)
    top_head_indices = head_out_indices[:len(head_out_indices) // 2].sort().values
    top_end_indices, top_end_labels, top_start_indices, top_start_labels = [], [], [], []
    for i in top_head_indices:
        i = i.item()
        top_start_indices.append(i)
        top_start_labels.append(start_labels[i])
        for j in range(3):
            top_end_indices.append(3 * i + j)
            top_end_labels.append(end_labels[3 * i + j])
    filtered = head_path_attr[top_end_indices, :][:, top_start_indices].sum(-1)
    by_type = [head_path_attr[top_end_indices, :][:, top_start_indices][j::3].sum(-1) for j in range(3)]
    top_head_path_attr = einops.rearrange(filtered, "(head_end qkv) head_start -> qkv head_end head_start", qkv=3)
    ns["out"]["top_head_paths"] = [head_out_values, filtered, *by_type, top_head_path_attr]
    ns["out"]["top_head_labels"] = [top_start_labels, top_end_labels, [i[:-1] for i in top_end_labels[::3]]]


def attr_interesting_heads(ns):  # TL's cell 24 (GPT-2's L5H5, L8H6, L9H9 become the tiny model's L1H1, L2H0, L2H3)
    import einops

    model, head_path_attr, HEAD_NAMES = ns["model"], ns["head_path_attr"], ns["HEAD_NAMES"]
    interesting_heads = [1 * model.cfg.n_heads + 1, 2 * model.cfg.n_heads + 0, 2 * model.cfg.n_heads + 3]
    interesting_head_labels = [HEAD_NAMES[i] for i in interesting_heads]
    paths = []
    for head_index, label in zip(interesting_heads, interesting_head_labels):
        in_paths = head_path_attr[3 * head_index: 3 * head_index + 3].sum(-1)
        out_paths = head_path_attr[:, head_index].sum(-1)
        out_paths = einops.rearrange(out_paths, "(layer_head qkv) -> qkv layer_head", qkv=3)
        all_paths = torch.cat([in_paths, out_paths], dim=0)
        all_paths = einops.rearrange(all_paths, "path_type (layer head) -> path_type layer head",
                                     layer=model.cfg.n_layers, head=model.cfg.n_heads)
        paths.append(all_paths)
    ns["out"]["interesting_head_paths"] = paths


def attr_cache_of_attributions(ns):  # TL's cells 25-26
    from transformer_lens import ActivationCache

    model = ns["model"]
    clean_cache, corrupted_cache, corrupted_grad_cache = (ns["attr_clean_cache"], ns["attr_corrupted_cache"],
                                                          ns["attr_corrupted_grad_cache"])
    attribution_cache_dict = {}
    shared_keys = (set(corrupted_grad_cache.cache_dict.keys()) & set(clean_cache.cache_dict.keys())
                   & set(corrupted_cache.cache_dict.keys()))
    for key in shared_keys:
        attribution_cache_dict[key] = corrupted_grad_cache.cache_dict[key] * (
            clean_cache.cache_dict[key] - corrupted_cache.cache_dict[key])
    attr_cache = ActivationCache(attribution_cache_dict, model)
    str_tokens = model.to_str_tokens(ns["clean_tokens"][0])
    context_length = len(str_tokens)
    ns.update(attr_cache=attr_cache, str_tokens=str_tokens, context_length=context_length)
    ns["out"]["attr_cache_keys"] = sorted(k for k in shared_keys if "hook_scale" in k or "hook_pattern" in k)


def attr_vs_activation_patching(ns):  # TL's cell 27
    model, patching = ns["model"], ns["patching"]
    every_block = patching.get_act_patch_block_every(model, ns["corrupted_tokens"], ns["clean_cache"], ns["ioi_metric"])
    ns["every_block_act_patch_result"] = every_block
    ns["out"]["attr_block_every"] = every_block


def attr_patch_block_every(ns):  # TL's cells 28-29
    import einops

    model, attr_cache, context_length = ns["model"], ns["attr_cache"], ns["context_length"]

    def get_attr_patch_block_every(attr_cache):
        resid_pre_attr = einops.reduce(attr_cache.stack_activation("resid_pre"),
                                       "layer batch pos d_model -> layer pos", "sum")
        attn_out_attr = einops.reduce(attr_cache.stack_activation("attn_out"),
                                      "layer batch pos d_model -> layer pos", "sum")
        mlp_out_attr = einops.reduce(attr_cache.stack_activation("mlp_out"),
                                     "layer batch pos d_model -> layer pos", "sum")
        return torch.stack([resid_pre_attr, attn_out_attr, mlp_out_attr], dim=0)

    every_block_attr_patch_result = get_attr_patch_block_every(attr_cache)
    ns["out"]["attr_patch_block_every"] = every_block_attr_patch_result
    # the scatter of cell 29: attribution against activation patching, one point per layer and position
    ns["out"]["block_scatter"] = [every_block_attr_patch_result.reshape(3, -1),
                                  ns["every_block_act_patch_result"].reshape(3, -1),
                                  einops.repeat(torch.arange(model.cfg.n_layers), "layer -> (layer pos)",
                                                pos=context_length)]


def attr_act_patch_head_all_pos_every(ns):  # TL's cell 30
    patching = ns["patching"]
    ns["every_head_all_pos_act_patch_result"] = patching.get_act_patch_attn_head_all_pos_every(
        ns["model"], ns["corrupted_tokens"], ns["clean_cache"], ns["ioi_metric"])
    ns["out"]["every_head_all_pos_act"] = ns["every_head_all_pos_act_patch_result"]


def _attr_every(attr_cache, pattern_to):
    import einops

    return torch.stack([
        einops.reduce(attr_cache.stack_activation("z"), f"layer batch pos head_index d_head -> {pattern_to[0]}", "sum"),
        einops.reduce(attr_cache.stack_activation("q"), f"layer batch pos head_index d_head -> {pattern_to[0]}", "sum"),
        einops.reduce(attr_cache.stack_activation("k"), f"layer batch pos head_index d_head -> {pattern_to[0]}", "sum"),
        einops.reduce(attr_cache.stack_activation("v"), f"layer batch pos head_index d_head -> {pattern_to[0]}", "sum"),
        einops.reduce(attr_cache.stack_activation("pattern"),
                      f"layer batch head_index dest_pos src_pos -> {pattern_to[1]}", "sum")])


def attr_patch_head_all_pos_every(ns):  # TL's cells 31-33 (cell 33's heads: the tiny model's, as cell 24's)
    import einops

    model = ns["model"]
    # TL's get_attr_patch_attn_head_all_pos_every: five einops.reduce of attr_cache.stack_activation
    every_head_all_pos_attr_patch_result = _attr_every(ns["attr_cache"], ("layer head_index", "layer head_index"))
    ns["out"]["every_head_all_pos_attr"] = every_head_all_pos_attr_patch_result
    ns["out"]["head_scatter"] = [every_head_all_pos_attr_patch_result.reshape(5, -1),
                                 ns["every_head_all_pos_act_patch_result"].reshape(5, -1),
                                 einops.repeat(torch.arange(model.cfg.n_layers), "layer -> (layer head)",
                                               head=model.cfg.n_heads)]
    clean_cache = ns["clean_cache"]
    graph_tok_labels = [f"{tok}_{i}" for i, tok in enumerate(model.to_str_tokens(ns["clean_tokens"][0]))]
    ns["graph_tok_labels"] = graph_tok_labels
    ns["out"]["patterns_of_heads"] = [clean_cache["pattern", 1][:, 1], clean_cache["pattern", 2][:, 0],
                                      clean_cache["pattern", 2][:, 3]]


def attr_by_pos_every(ns):  # TL's cells 34-36
    import einops

    model, patching = ns["model"], ns["patching"]
    every_head_by_pos_act_patch_result = patching.get_act_patch_attn_head_by_pos_every(
        model, ns["corrupted_tokens"], ns["clean_cache"], ns["ioi_metric"])
    every_head_by_pos_act_patch_result = einops.rearrange(every_head_by_pos_act_patch_result,
                                                          "act_type layer pos head -> act_type (layer head) pos")
    every_head_by_pos_attr_patch_result = _attr_every(ns["attr_cache"], ("layer pos head_index",
                                                                         "layer dest_pos head_index"))
    every_head_by_pos_attr_patch_result = einops.rearrange(every_head_by_pos_attr_patch_result,
                                                           "act_type layer pos head -> act_type (layer head) pos")
    ns["out"]["every_head_by_pos"] = [every_head_by_pos_act_patch_result, every_head_by_pos_attr_patch_result,
                                      einops.repeat(torch.arange(model.cfg.n_layers), "layer -> (layer head pos)",
                                                    head=model.cfg.n_heads, pos=ns["context_length"])]


def attr_factual(ns):  # TL's cells 37-42: GPT-2 XL becomes the tiny model (the loading line), prompts shortened
    from functools import partial

    gpt2_xl, utils = ns["model"], ns["utils"]
    clean_prompt = "The E is in P"
    clean_answer = "P"
    corrupted_prompt = "The C is in R"
    corrupted_answer = "R"
    utils.test_prompt(clean_prompt, clean_answer, gpt2_xl, print_details=False)
    utils.test_prompt(corrupted_prompt, corrupted_answer, gpt2_xl, print_details=False)
    clean_answer_index = gpt2_xl.to_single_token(clean_answer)
    corrupted_answer_index = gpt2_xl.to_single_token(corrupted_answer)

    def factual_logit_diff(logits):
        return logits[0, -1, clean_answer_index] - logits[0, -1, corrupted_answer_index]

    clean_logits, clean_cache = gpt2_xl.run_with_cache(clean_prompt)
    CLEAN_LOGIT_DIFF_FACTUAL = factual_logit_diff(clean_logits).item()
    corrupted_logits, _ = gpt2_xl.run_with_cache(corrupted_prompt)
    CORRUPTED_LOGIT_DIFF_FACTUAL = factual_logit_diff(corrupted_logits).item()

    def factual_metric(logits):
        return (factual_logit_diff(logits) - CORRUPTED_LOGIT_DIFF_FACTUAL) / (
            CLEAN_LOGIT_DIFF_FACTUAL - CORRUPTED_LOGIT_DIFF_FACTUAL)

    clean_tokens = gpt2_xl.to_tokens(clean_prompt)
    clean_str_tokens = gpt2_xl.to_str_tokens(clean_prompt)
    corrupted_tokens = gpt2_xl.to_tokens(corrupted_prompt)

    def act_patch_residual(clean_cache, corrupted_tokens, model, metric):
        if corrupted_tokens.ndim == 1:
            corrupted_tokens = corrupted_tokens.unsqueeze(0)
        seq_len = corrupted_tokens.shape[-1]
        residual_patches = torch.zeros((model.cfg.n_layers, seq_len), device=model.cfg.device)

        def residual_hook(resid_pre, hook, layer, pos):
            resid_pre = resid_pre.clone()
            resid_pre[:, pos, :] = clean_cache["resid_pre", layer][:, pos, :]
            return resid_pre

        for layer in range(model.cfg.n_layers):
            for pos in range(seq_len):
                patched_logits = model.run_with_hooks(corrupted_tokens, fwd_hooks=[
                    (f"blocks.{layer}.hook_resid_pre", partial(residual_hook, layer=layer, pos=pos))])
                residual_patches[layer, pos] = metric(patched_logits).item()
        return residual_patches

    residual_act_patch = act_patch_residual(clean_cache, corrupted_tokens, gpt2_xl, factual_metric)
    ns["out"]["factual"] = [torch.tensor([CLEAN_LOGIT_DIFF_FACTUAL, CORRUPTED_LOGIT_DIFF_FACTUAL,
                                          factual_metric(clean_logits).item(), factual_metric(corrupted_logits).item()]),
                            residual_act_patch]
    ns["out"]["factual_str_tokens"] = clean_str_tokens


ATTRIBUTION_PATCHING_DEMO: list[Cell] = [
    ap_setup, ap_baselines, attr_setup, attr_fwd_bwd, attr_attention, attr_head_names, attr_plot_attention_attr,
    attr_residual, attr_layer_out, attr_head_out, attr_head_vectors, attr_head_patterns, attr_head_path,
    attr_top_head_paths, attr_interesting_heads, attr_cache_of_attributions, attr_vs_activation_patching,
    attr_patch_block_every, attr_act_patch_head_all_pos_every, attr_patch_head_all_pos_every, attr_by_pos_every,
    attr_factual]

# ------------------------------------------------------------------------------- Direct Logit Attribution Demo
def dla_setup(ns):
    model = ns["model"]
    prompt = "When J and M went to the shops, J gave the bag to"
    tokens = model.to_tokens(prompt)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    mary_id = model.to_single_token("M")
    john_id = model.to_single_token("J")
    logit_direction = (model.tokens_to_residual_directions(torch.tensor(mary_id))
                       - model.tokens_to_residual_directions(torch.tensor(john_id)))
    ns.update(dla_cache=cache, logit_direction=logit_direction, mary_id=mary_id, john_id=john_id)
    ns["out"]["dla_direction_shape"] = list(logit_direction.shape)


def dla_naive_and_projected(ns):
    cache, logit_direction = ns["dla_cache"], ns["logit_direction"]
    naive = cache.get_full_resid_decomposition(layer=-1, pos_slice=-1, apply_ln=True) @ logit_direction
    projected, labels = cache.get_full_resid_decomposition(layer=-1, pos_slice=-1, apply_ln=True,
                                                           project_output_onto=logit_direction, return_labels=True)
    assert torch.allclose(naive, projected, atol=1e-4), "Outputs should match!"
    ns.update(projected=projected, labels=labels)
    ns["out"]["dla_components"] = projected  # heads, neurons, embed, pos_embed, bias
    ns["out"]["dla_labels"] = labels


def dla_top_components(ns):
    projected, labels = ns["projected"], ns["labels"]
    flat = projected[:, 0]
    top_indices = flat.abs().topk(8).indices
    lines = [f"{rank}. {labels[i]:>10s}: {flat[i].item():+.4f}" for rank, i in enumerate(top_indices, start=1)]
    assert len(lines) == 8


def dla_multi_target(ns):
    model, cache, labels = ns["model"], ns["dla_cache"], ns["labels"]
    target_ids = torch.tensor([ns["mary_id"], ns["john_id"], model.to_single_token("t")])
    target_directions = model.tokens_to_residual_directions(target_ids).T
    multi = cache.get_full_resid_decomposition(layer=-1, pos_slice=-1, apply_ln=True,
                                               project_output_onto=target_directions)
    neuron_idx_start = next(i for i, lab in enumerate(labels) if lab.startswith("L") and "N" in lab)
    neuron_idx_end = next((i for i, lab in enumerate(labels)
                           if i > neuron_idx_start and not (lab.startswith("L") and "N" in lab)), len(labels))
    neuron_slab = multi[neuron_idx_start:neuron_idx_end, 0]
    top = []
    for col, tid in enumerate(target_ids):
        top_neuron_local = neuron_slab[:, col].abs().argmax().item()
        top.append((model.to_string(tid), labels[neuron_idx_start + top_neuron_local]))
    assert len(top) == 3
    ns["out"]["dla_neuron_slab"] = neuron_slab
    ns["out"]["dla_multi"] = multi
    ns["out"]["dla_top_neurons"] = top


def dla_memory_watch(ns):
    from torch.utils._python_dispatch import TorchDispatchMode

    cache, logit_direction = ns["dla_cache"], ns["logit_direction"]

    class MaxTensorWatcher(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.max_numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            for t in (result if isinstance(result, (list, tuple)) else (result,)):
                if isinstance(t, torch.Tensor):
                    self.max_numel = max(self.max_numel, t.numel())
            return result

    with MaxTensorWatcher() as naive_watcher:
        _ = cache.get_full_resid_decomposition(layer=-1, pos_slice=-1, apply_ln=True) @ logit_direction
    with MaxTensorWatcher() as projected_watcher:
        _ = cache.get_full_resid_decomposition(layer=-1, pos_slice=-1, apply_ln=True,
                                               project_output_onto=logit_direction)
    assert naive_watcher.max_numel > 0 and projected_watcher.max_numel > 0  # memory: interp projects afterwards


DLA_DEMO: list[Cell] = [dla_setup, dla_naive_and_projected, dla_top_components, dla_multi_target, dla_memory_watch]

# ----------------------------------------------------------------------------------------- Head Detector Demo
# The demo copies TransformerLens's head detector into a cell; here it is imported from TL (the same code), and it
# runs on an interp model as on the bridge (it needs run_with_cache, to_str_tokens, to_tokens and cfg).
# (shortened: the tiny model's context is 128 positions and its tokenizer gives one token per character)
HD_PROMPT = "The head detector feature for TransformerLens allows users to check for common heads."


def hd_previous_token(ns):
    from transformer_lens.head_detector import detect_head

    model = ns["model"]
    head_scores = detect_head(model, HD_PROMPT, "previous_token_head")
    _, cache = model.run_with_cache(HD_PROMPT)
    ns["out"]["hd_previous"] = head_scores
    ns["out"]["hd_pattern2"] = cache["pattern", 2, "attn"].squeeze(0)


def hd_previous_token_excluding(ns):
    from transformer_lens.head_detector import detect_head

    head_scores = detect_head(ns["model"], HD_PROMPT, "previous_token_head", exclude_bos=True,
                              exclude_current_token=True)
    ns["out"]["hd_previous_excluding"] = head_scores


def hd_custom_pattern(ns):
    from transformer_lens.head_detector import detect_head

    model = ns["model"]
    # a leading space: the tiny byte-level tokenizer has no word-initial space tokens as GPT-2's BPE has
    prompt = " The following lexical sequence has been optimised for the maximisation of letter combinations."
    tokens = model.to_str_tokens(prompt)
    detection_pattern = []
    for i in range(2):
        detection_pattern.append([0 for t in tokens])
    for i in range(2, len(tokens)):
        current_token = i
        previous_tokens_in_word = 0
        while not tokens[current_token].startswith(" "):
            previous_tokens_in_word += 1
            current_token -= 1
        detection_pattern.append([0 for j in range(i - previous_tokens_in_word)] + [1 for j in range(previous_tokens_in_word)]
                                 + [0 for j in range(i + 1, len(tokens) + 1)])
    detection_pattern = torch.as_tensor(detection_pattern).to(model.cfg.device)
    _, cache = model.run_with_cache(prompt)
    for measure in ("mul", "abs"):
        ns["out"][f"hd_custom_{measure}"] = detect_head(model, prompt, detection_pattern=detection_pattern,
                                                        exclude_bos=False, exclude_current_token=True,
                                                        error_measure=measure)
    scores = []
    for i in range(3):
        scores.append(detect_head(model, prompt, detection_pattern=detection_pattern, exclude_bos=False,
                                  exclude_current_token=True, error_measure="abs"))
    ns["out"]["hd_custom_mean"] = torch.stack(scores).mean(dim=0)


def hd_several_prompts(ns):
    from transformer_lens.head_detector import detect_head

    model = ns["model"]
    prompts = ["This is the first the test prompt.", "This is another test prompt, being just a sequence of tokens.",
               "If you're interested in mechanistic interpretability, this is how the sausage REALLY is made."]
    ns["out"]["hd_prev_avg"] = detect_head(model, prompts, "previous_token_head", error_measure="abs")
    ns["out"]["hd_dup_avg"] = detect_head(model, prompts, "duplicate_token_head", error_measure="abs")
    prompts = ["one two three one two three one two three", "1 2 3 4 5 1 2 3 4 1 2 3 1 2 3 4 5 6 7",
               "green ideas sleep furiously; green ideas don't sleep furiously"]
    ns["out"]["hd_dup_repeated"] = detect_head(model, prompts, "duplicate_token_head", exclude_bos=False,
                                               exclude_current_token=False, error_measure="abs")
    ns["out"]["hd_induction"] = detect_head(model, prompts, "induction_head", exclude_bos=False,
                                            exclude_current_token=False, error_measure="abs")


def hd_ones_pattern(ns):
    from transformer_lens.head_detector import detect_head

    model = ns["model"]
    seq_len = len(model.to_str_tokens(HD_PROMPT))
    ones_detection_pattern = torch.tril(torch.ones(seq_len, seq_len).to(model.cfg.device))
    ns["out"]["hd_ones_mul"] = detect_head(model, HD_PROMPT, ones_detection_pattern, exclude_bos=True,
                                           exclude_current_token=True)
    ns["out"]["hd_ones_abs"] = detect_head(model, HD_PROMPT, ones_detection_pattern, exclude_bos=True,
                                           exclude_current_token=True, error_measure="abs")


HEAD_DETECTOR_DEMO: list[Cell] = [hd_previous_token, hd_previous_token_excluding, hd_custom_pattern,
                                  hd_several_prompts, hd_ones_pattern]

DEMOS: dict[str, list[Cell]] = {"Main_Demo": MAIN_DEMO, "Activation_Patching_in_TL_Demo": ACTIVATION_PATCHING_DEMO,
                                "Attribution_Patching_Demo": ATTRIBUTION_PATCHING_DEMO,
                                "Direct_Logit_Attribution_Demo": DLA_DEMO, "Head_Detector_Demo": HEAD_DETECTOR_DEMO}
#: TL's code cells (numbered from 0 among each notebook's code cells, TL's main at the time of writing) that each
#: step above runs, where the demo is enumerated cell by cell
TL_CELLS: dict[str, dict[str, tuple[int, ...]]] = {
    "Activation_Patching_in_TL_Demo": {
        "ap_setup": (7, 8), "ap_baselines": (9, 10), "ap_get_act_patch_resid_pre": (12,),
        "ap_get_act_patch_attn_head_out_all_pos": (13,), "ap_get_act_patch_attn_head_out_by_pos": (14,),
        "ap_get_act_patch_block_every": (15,), "ap_get_act_patch_attn_head_all_pos_every": (16,),
        "ap_get_act_patch_attn_head_by_pos_every": (17,), "ap_induction_setup": (18, 19, 20),
        "ap_induction_patching": (21,), "ap_induction_other_baselines": (22, 23)},
    "Attribution_Patching_Demo": {
        "attr_setup": (6,), "ap_setup": (7,), "ap_baselines": (8, 9), "attr_fwd_bwd": (11,), "attr_attention": (12,),
        "attr_head_names": (13,), "attr_plot_attention_attr": (14,), "attr_residual": (15,), "attr_layer_out": (16,),
        "attr_head_out": (17,), "attr_head_vectors": (18,), "attr_head_patterns": (19,), "attr_head_path": (20,),
        "attr_top_head_paths": (21, 22, 23), "attr_interesting_heads": (24,), "attr_cache_of_attributions": (25, 26),
        "attr_vs_activation_patching": (27,), "attr_patch_block_every": (28, 29),
        "attr_act_patch_head_all_pos_every": (30,), "attr_patch_head_all_pos_every": (31, 32, 33),
        "attr_by_pos_every": (34, 35, 36), "attr_factual": (37, 38, 39, 40, 41, 42)},
}
#: TL's code cells that use a model, per enumerated demo (install, import, renderer and plotting-helper cells
#: aside; the Activation demo's ``DO_SLOW_RUNS = True`` and the Attribution demo's ``Metric`` type alias too)
MODEL_CELLS = {"Activation_Patching_in_TL_Demo": set(range(7, 24)) - {11},
               "Attribution_Patching_Demo": set(range(6, 43)) - {10}}
#: demo cells that raise on TransformerLens 3.9's bridge itself on every architecture, and why: not runnable, so not
#: counted (a step's cells; interp runs them where it can). None since the demo's current cell 11 (run_with_cache
#: plus alias entries through hook_dict), whose caches have blocks.0.hook_resid_pre: the residual and block cells
#: (15, 28-29) used to raise on the bridge with the older cell 11's hand-made caches
FAILS_ON_TL: dict[str, str] = {}


_GQA_STACK = ("TL's cell stacks per-head tensors of q (query heads) with k / v (key/value heads): on a grouped-query "
              "model torch.stack raises on TL's bridge itself (and on interp, whose k / v also have one entry per "
              "key/value head, as the bridge's)")
#: cells that raise on TL's bridge of one architecture only (``arch -> {step: why}``)
FAILS_ON_TL_HERE = {"llama": {
    "attr_head_path": _GQA_STACK, "attr_top_head_paths": "needs cell 20's head_path_attr",
    "attr_interesting_heads": "needs cell 20's head_path_attr", "attr_patch_head_all_pos_every": _GQA_STACK,
    "attr_by_pos_every": _GQA_STACK}}


def _counts(demo: str) -> tuple[int, int]:
    """``(TL's model cells the steps run, TL's model cells)`` of an enumerated demo."""
    covered = {c for cells in TL_CELLS[demo].values() for c in cells}
    assert covered <= MODEL_CELLS[demo], sorted(covered - MODEL_CELLS[demo])
    assert set(TL_CELLS[demo]) == {c.__name__ for c in DEMOS[demo]}, demo
    return len(covered), len(MODEL_CELLS[demo])


def runnable_counts(demo: str, arch: str) -> tuple[int, int]:
    """``(cells TL runs that interp runs as written, TL's model cells that run on TL)`` of an enumerated demo on
    ``arch``: TL's model cells less those of the steps in :data:`FAILS_ON_TL` / :data:`FAILS_ON_TL_HERE` (interp
    runs those of :data:`FAILS_ON_TL` all the same)."""
    written, total = _counts(demo)
    failing = sum(len(TL_CELLS[demo][step]) for step in {**FAILS_ON_TL, **FAILS_ON_TL_HERE.get(arch, {})}
                  if step in TL_CELLS[demo])
    return written - failing, total - failing


#: TL's code cells that each demo's steps run, of the demo's code cells that use a model: reported in the TL-users
#: docs (checked by test_docs_report_these_counts); the Main, DLA and Head Detector demos were counted by hand
COUNTS = {"Main_Demo": (37, 37), "Activation_Patching_in_TL_Demo": _counts("Activation_Patching_in_TL_Demo"),
          "Attribution_Patching_Demo": _counts("Attribution_Patching_Demo"),
          "Direct_Logit_Attribution_Demo": (9, 9), "Head_Detector_Demo": (15, 15)}


# ----------------------------------------------------------------------------------------------- running
def run_cells(cells: list[Cell], model, utils, patching, shared_params=()) -> tuple[dict[str, Any], list[str]]:
    """Run ``cells`` in order in one namespace; ``(numbers they computed, cells that raised)``."""
    ns: dict[str, Any] = {"model": model, "utils": utils, "patching": patching, "out": {},
                          "shared_params": set(shared_params)}
    failed = []
    for cell in cells:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cell(ns)
        except Exception as e:  # noqa: BLE001 - a cell that fails is counted and named
            failed.append(f"{cell.__name__}: {type(e).__name__}: {e}"[:300])
    return ns["out"], failed


@functools.lru_cache(maxsize=None)
def folder_of(arch: str) -> str:
    hf, _ = tiny_model(arch, seed=13, n_layers=3, perturb_norms=True)
    return hf.config._name_or_path


def wrap(arch: str, backend: str) -> interp.Model:
    """The loading line: the model on ``backend``, with TransformerLens's BOS rule (TL prepends a BOS to every text
    by default; interp follows the tokenizer unless ``prepend_bos`` is set: docs/for_transformer_lens_users.md)."""
    import transformers
    folder = folder_of(arch)
    model = interp.wrap(transformers.AutoModelForCausalLM.from_pretrained(folder).eval(),
                        transformers.AutoTokenizer.from_pretrained(folder), backend=backend)
    model.prepend_bos = True
    return model


@functools.lru_cache(maxsize=None)
def bridge_of(arch: str):
    """TransformerLens's bridge of the same weights (booted by interp's transformer_lens backend: no weight
    processing, so activations are the Hugging Face model's)."""
    return wrap(arch, "transformer_lens").tl


def same(a, b, key) -> None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        a, b = torch.as_tensor(a).float(), torch.as_tensor(b).float()
        assert a.shape == b.shape, (key, a.shape, b.shape)
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-4), (key, (a - b).abs().max())
    elif isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
        assert len(a) == len(b), key
        for x, y in zip(a, b):
            same(x, y, key)
    else:
        assert a == b, (key, a, b)


@functools.lru_cache(maxsize=None)
def reference(demo: str, arch: str) -> tuple[dict, list[str], frozenset]:
    """The demo's cells on TransformerLens: the bridge, ``transformer_lens.utils`` / ``.patching``."""
    import transformer_lens.patching as tl_patching
    import transformer_lens.utils as tl_utils

    bridge = bridge_of(arch)
    shared = frozenset(n for n, _ in bridge.tl_named_parameters()) & frozenset(
        n for n, _ in wrap(arch, "torch").tl_named_parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref, ref_failed = run_cells(DEMOS[demo], bridge, tl_utils, tl_patching, shared)
        bridge.set_use_attn_result(False)
    return ref, ref_failed, shared


def check_demo(demo: str, arch: str, backend: str) -> None:
    ref, ref_failed, shared = reference(demo, arch)
    model = wrap(arch, backend)
    ours, failed = run_cells(DEMOS[demo], model, interp.utils, interp.patching, shared)
    # cells that fail on TransformerLens itself are known and named; their numbers are compared where TL ran
    tl_failed = {f.split(":")[0] for f in ref_failed}
    assert tl_failed <= set(FAILS_ON_TL) | set(FAILS_ON_TL_HERE.get(arch, {})), ref_failed
    # interp runs every cell TL runs; it may fail only where TL fails too, for the reason named
    assert {f.split(":")[0] for f in failed} <= set(FAILS_ON_TL_HERE.get(arch, {})), failed
    assert set(ref) <= set(ours)
    for key in ref:
        same(ours[key], ref[key], key)




@pytest.mark.parametrize("backend", [BACKENDS[0], *(pytest.param(b, marks=pytest.mark.slow) for b in BACKENDS[1:])])
def test_main_demo_cells_run_as_written_and_equal_transformer_lens(backend):
    check_demo("Main_Demo", "gpt2", backend)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("demo", ["Activation_Patching_in_TL_Demo", "Attribution_Patching_Demo"])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_patching_demo_cells_run_as_written_and_equal_transformer_lens(demo, arch, backend):
    check_demo(demo, arch, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["gpt2", pytest.param("llama", marks=pytest.mark.slow)])
def test_direct_logit_attribution_demo_cells(arch, backend):
    check_demo("Direct_Logit_Attribution_Demo", arch, backend)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_head_detector_demo_cells(arch, backend):
    check_demo("Head_Detector_Demo", arch, backend)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_main_demo_on_a_grouped_query_model(backend):
    check_demo("Main_Demo", "llama", backend)


def test_docs_report_these_counts():
    """docs/for_transformer_lens_users.md reports :data:`COUNTS` and the runnable counts of this file, not numbers
    typed apart from it."""
    from pathlib import Path

    docs = (Path(__file__).parent.parent / "docs" / "for_transformer_lens_users.md").read_text()
    titles = {"Main_Demo": "Main Demo", "Activation_Patching_in_TL_Demo": "Activation Patching in TL Demo",
              "Attribution_Patching_Demo": "Attribution Patching Demo",
              "Direct_Logit_Attribution_Demo": "Direct Logit Attribution Demo", "Head_Detector_Demo": "Head Detector Demo"}
    for demo, (written, total) in COUNTS.items():
        assert f"| {titles[demo]} | {written} / {total} |" in docs, demo
    for demo in TL_CELLS:
        for arch in ("gpt2", "llama"):
            ran, runnable = runnable_counts(demo, arch)
            assert f"{titles[demo]}: {arch} {ran} / {runnable}" in docs, (demo, arch, ran, runnable)
    written, total = map(sum, zip(*COUNTS.values()))
    assert f"{written} of {total} model cells" in docs
