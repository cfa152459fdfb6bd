"""interp.utils.get_act_name spells hook names exactly as TransformerLens's get_act_name does."""
import warnings

import pytest

from interp.utils import get_act_name

CASES = [("resid_post", 3), ("resid_pre", 0), ("attn", 2), ("pattern", 1), ("z", 5), ("q", 0), ("key", 1),
         ("query", 2), ("value", 3), ("attn_scores", 1), ("attn_logits", 1), ("result", 4), ("rot_k", 1), ("pre", 2),
         ("post", 2), ("mid", 1), ("pre_linear", 0), ("mlp_post", 3), ("mlp_pre", 3), ("mlp_out", 2), ("attn_out", 2),
         ("embed", None), ("pos_embed", None), ("scale", None), ("normalized", None), ("scale", 2, "ln1"),
         ("normalized", 3, "ln2"), ("resid_post3",), ("attn2",), ("pre5",), ("scale4ln1",), ("z0a",),
         ("blocks.0.hook_resid_pre",), ("hook_embed",), ("k", 1, "a"), ("resid_mid", 2, "b"),
         ("attn_out", 1, "attention"), ("v", 0, "m"), ("in", 1), ("out", 2), ("mlp_in", 0), ("q_input", 1)]


@pytest.mark.parametrize("args", CASES, ids=[repr(c) for c in CASES])
def test_get_act_name_matches_transformer_lens(args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens.utils import get_act_name as tl_get_act_name
    assert get_act_name(*args) == tl_get_act_name(*args)


def test_get_act_name_hand_values_and_errors():
    assert get_act_name("resid_post", 3) == "blocks.3.hook_resid_post"
    assert get_act_name("attn", 2) == "blocks.2.attn.hook_pattern"
    assert get_act_name("scale") == "ln_final.hook_scale"
    with pytest.raises(TypeError):
        get_act_name("")
