"""TransformerLens's Exploratory Analysis Demo, its cells as a TransformerLens user writes them (issue #34).

:func:`exploratory_demo` is the demo's code (IOI prompts, logit difference, direct logit attribution, the logit
lens, per-layer and per-head attribution, attention patterns, residual-stream patching with hand-written hooks
and with the ``patching`` module, head ablation, induction scores), written once against TransformerLens's
API. It runs unchanged on an interp model of each backend (with ``interp.utils`` / ``interp.patching``) and on
TransformerLens itself (a TransformerBridge booted directly, with ``transformer_lens.utils`` /
``transformer_lens.patching``), on 3-layer models with non-identity norm weights and biases (Llama: RMSNorm,
grouped-query attention; GPT-2: LayerNorm with biases, learned positions). Every number agrees.

TransformerLens's attribution helpers (``apply_ln_to_stack``) assume ``fold_ln``: they divide by the norm's
scale and leave its weight to ``W_U``. interp never folds, so the reference is the bridge of the same loading (no
weight processing) and interp's helpers are TL's: on these models, whose norm weights are not 1, the attributions
are TL's numbers on unfolded weights (they do not add up to the logit difference, in TL as here;
``apply_ln_to_stack(..., include_weight=True)`` is interp's exact form, checked in tests/test_tl_habits.py).
"""
from __future__ import annotations

import functools
from functools import partial

import pytest
import torch

import interp
from interp.testing import tiny_model

BACKENDS = ("torch", "nnsight", "transformer_lens")
# equal-length prompts (the tiny tokenizer is byte-level: one token per character), answers one token each
PROMPTS = ["When Mary and John went, John gave to", "When John and Mary went, Mary gave to",
           "When Tom and Anna went, Anna gave to", "When Anna and Tom went, Tom gave to  "]
ANSWERS = [("M", "J"), ("J", "M"), ("T", "A"), ("A", "T")]


def exploratory_demo(model, utils, patching) -> dict[str, torch.Tensor]:
    """The demo's cells (TransformerLens's Exploratory Analysis Demo), unchanged but for the prompts."""
    import einops
    from fancy_einsum import einsum

    prompts, answers = PROMPTS, ANSWERS
    answer_tokens = torch.tensor([[model.to_single_token(answers[i][0]), model.to_single_token(answers[i][1])]
                                  for i in range(len(answers))])
    tokens = model.to_tokens(prompts, prepend_bos=True)
    original_logits, cache = model.run_with_cache(tokens)

    def logits_to_ave_logit_diff(logits, answer_tokens, per_prompt=False):
        final_logits = logits[:, -1, :]
        answer_logits = final_logits.gather(dim=-1, index=answer_tokens)
        answer_logit_diff = answer_logits[:, 0] - answer_logits[:, 1]
        if per_prompt:
            return answer_logit_diff
        return answer_logit_diff.mean()

    out = {"logits": original_logits[:, -1], "logit_diff": logits_to_ave_logit_diff(original_logits, answer_tokens,
                                                                                       per_prompt=True)}

    # direct logit attribution
    answer_residual_directions = model.tokens_to_residual_directions(answer_tokens)
    logit_diff_directions = answer_residual_directions[:, 0] - answer_residual_directions[:, 1]
    final_residual_stream = cache["resid_post", -1]
    final_token_residual_stream = final_residual_stream[:, -1, :]
    scaled_final_token_residual_stream = cache.apply_ln_to_stack(final_token_residual_stream, layer=-1,
                                                                 pos_slice=-1)
    out["dla_total"] = einsum("batch d_model, batch d_model -> ", scaled_final_token_residual_stream,
                              logit_diff_directions) / len(prompts)

    def residual_stack_to_logit_diff(residual_stack, cache):
        scaled_residual_stack = cache.apply_ln_to_stack(residual_stack, layer=-1, pos_slice=-1)
        return einsum("... batch d_model, batch d_model -> ...", scaled_residual_stack,
                      logit_diff_directions) / len(prompts)

    # logit lens, per layer, per head
    accumulated_residual, labels = cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1, return_labels=True)
    out["logit_lens"] = residual_stack_to_logit_diff(accumulated_residual, cache)
    out["logit_lens_labels"] = labels
    per_layer_residual, labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
    per_layer_logit_diffs = residual_stack_to_logit_diff(per_layer_residual, cache)
    out["per_layer"] = per_layer_logit_diffs
    out["per_layer_labels"] = labels
    per_head_residual, labels = cache.stack_head_results(layer=-1, pos_slice=-1, return_labels=True)
    per_head_logit_diffs = residual_stack_to_logit_diff(per_head_residual, cache)
    out["per_head"] = einops.rearrange(per_head_logit_diffs, "(layer head_index) -> layer head_index",
                                       layer=model.cfg.n_layers, head_index=model.cfg.n_heads)
    out["per_head_labels"] = labels

    # attention patterns
    out["pattern_1"] = cache["pattern", 1][:, 2]
    out["pattern_last"] = cache["blocks.2.attn.hook_pattern"]

    # activation patching, by hand
    corrupted_prompts = []
    for i in range(0, len(prompts), 2):
        corrupted_prompts.append(prompts[i + 1])
        corrupted_prompts.append(prompts[i])
    corrupted_tokens = model.to_tokens(corrupted_prompts, prepend_bos=True)
    corrupted_logits, corrupted_cache = model.run_with_cache(corrupted_tokens, return_type="logits")
    corrupted_average_logit_diff = logits_to_ave_logit_diff(corrupted_logits, answer_tokens)
    original_average_logit_diff = logits_to_ave_logit_diff(original_logits, answer_tokens)

    def normalize_patched_logit_diff(patched_logit_diff):
        return (patched_logit_diff - corrupted_average_logit_diff) / (original_average_logit_diff
                                                                      - corrupted_average_logit_diff)

    def patch_residual_component(corrupted_residual_component, hook, pos, clean_cache):
        corrupted_residual_component[:, pos, :] = clean_cache[hook.name][:, pos, :]
        return corrupted_residual_component

    patched_residual_stream_diff = torch.zeros(model.cfg.n_layers, tokens.shape[1])
    for layer in range(model.cfg.n_layers):
        for position in range(0, tokens.shape[1], 7):
            hook_fn = partial(patch_residual_component, pos=position, clean_cache=cache)
            patched_logits = model.run_with_hooks(corrupted_tokens, fwd_hooks=[
                (utils.get_act_name("resid_pre", layer), hook_fn)], return_type="logits")
            patched_logit_diff = logits_to_ave_logit_diff(patched_logits, answer_tokens)
            patched_residual_stream_diff[layer, position] = normalize_patched_logit_diff(patched_logit_diff)
    out["patch_resid_by_hand"] = patched_residual_stream_diff

    def patch_head_vector(corrupted_head_vector, hook, head_index, clean_cache):
        corrupted_head_vector[:, :, head_index, :] = clean_cache[hook.name][:, :, head_index, :]
        return corrupted_head_vector

    patched_head_z_diff = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)
    for layer in range(model.cfg.n_layers):
        for head_index in range(model.cfg.n_heads):
            hook_fn = partial(patch_head_vector, head_index=head_index, clean_cache=cache)
            patched_logits = model.run_with_hooks(corrupted_tokens, fwd_hooks=[
                (utils.get_act_name("z", layer, "attn"), hook_fn)], return_type="logits")
            patched_head_z_diff[layer, head_index] = normalize_patched_logit_diff(
                logits_to_ave_logit_diff(patched_logits, answer_tokens))
    out["patch_z_by_hand"] = patched_head_z_diff

    # the patching module
    def ioi_metric(logits):
        return normalize_patched_logit_diff(logits_to_ave_logit_diff(logits, answer_tokens))

    out["patch_resid_module"] = patching.get_act_patch_resid_pre(model, corrupted_tokens, cache, ioi_metric)
    out["patch_head_out_module"] = patching.get_act_patch_attn_head_out_all_pos(model, corrupted_tokens, cache,
                                                                               ioi_metric)

    # ablating one head's value vectors
    def head_ablation_hook(value, hook, head_index_to_ablate):
        value[:, :, head_index_to_ablate, :] = 0.0
        return value

    ablated_logits = model.run_with_hooks(tokens, fwd_hooks=[
        (utils.get_act_name("v", 1), partial(head_ablation_hook, head_index_to_ablate=0))])
    out["ablated_logit_diff"] = logits_to_ave_logit_diff(ablated_logits, answer_tokens, per_prompt=True)

    # induction scores from the attention pattern of repeated random tokens
    seq_len, batch = 12, 3
    torch.manual_seed(0)
    random_tokens = torch.randint(10, 200, (batch, seq_len)).to(model.cfg.device)
    repeated_tokens = einops.repeat(random_tokens, "batch seq_len -> batch (2 seq_len)")
    induction_score_store = torch.zeros((model.cfg.n_layers, model.cfg.n_heads), device=model.cfg.device)

    def induction_score_hook(pattern, hook):
        induction_stripe = pattern.diagonal(dim1=-2, dim2=-1, offset=1 - seq_len)
        induction_score = einops.reduce(induction_stripe, "batch index pos -> index", "mean")
        induction_score_store[hook.layer(), :] = induction_score

    pattern_hook_names_filter = lambda name: name.endswith("pattern")  # noqa: E731
    model.run_with_hooks(repeated_tokens, return_type=None,
                         fwd_hooks=[(pattern_hook_names_filter, induction_score_hook)])
    out["induction"] = induction_score_store
    return out


@functools.lru_cache(maxsize=None)
def folder_of(arch: str) -> str:
    hf, _ = tiny_model(arch, seed=11, n_layers=3, perturb_norms=True)
    return hf.config._name_or_path


@functools.lru_cache(maxsize=None)
def reference(arch: str) -> dict:
    """The demo on TransformerLens itself: the bridge booted from the model's folder, as interp loads it (no weight
    processing)."""
    import warnings

    import transformer_lens.patching as tl_patching
    import transformer_lens.utils as tl_utils
    from transformer_lens.model_bridge import TransformerBridge

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = TransformerBridge.boot_transformers(folder_of(arch), device="cpu")
        return exploratory_demo(bridge, tl_utils, tl_patching)


def close(a, b, rtol=1e-4, atol=1e-5) -> bool:
    return torch.allclose(torch.as_tensor(a).float(), torch.as_tensor(b).float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_exploratory_demo_runs_as_written_and_agrees_with_transformer_lens(arch, backend):
    import transformers

    folder = folder_of(arch)
    model = interp.wrap(transformers.AutoModelForCausalLM.from_pretrained(folder).eval(),
                        transformers.AutoTokenizer.from_pretrained(folder), backend=backend)
    ours = exploratory_demo(model, interp.utils, interp.patching)
    ref = reference(arch)
    # interp's answers are consistent: the last logit-lens entry is the whole residual's attribution, the
    # per-layer parts add up to it
    logit_diff = ours["logit_diff"].mean()
    assert close(ours["logit_lens"][-1], ours["dla_total"])
    assert close(ours["per_layer"].sum(), ours["dla_total"])
    assert ours["logit_lens_labels"] == ref["logit_lens_labels"] and ours["per_head_labels"] == ref["per_head_labels"]
    assert ours["per_layer_labels"] == ref["per_layer_labels"]
    for key in ("logits", "logit_diff", "dla_total", "logit_lens", "per_layer", "per_head", "pattern_1",
                "pattern_last", "patch_resid_by_hand", "patch_z_by_hand", "patch_resid_module",
                "patch_head_out_module", "ablated_logit_diff", "induction"):
        assert ours[key].shape == ref[key].shape, key
        assert close(ours[key], ref[key]), (key, ours[key], ref[key])
    # the logit difference itself is what the model says (not a lens artefact)
    assert close(logit_diff, ref["logit_diff"].mean())
