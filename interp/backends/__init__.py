"""Backend adapters: each turns canonical hooks into its library's mechanism.

* :mod:`.torch_hooks` — ``register_forward_hook`` / ``register_forward_pre_hook`` on HF modules;
* :mod:`.nnsight_backend` — an nnsight 0.8 ``NNsight`` trace over the same modules;
* :mod:`.transformer_lens` — TransformerLens ``TransformerBridge`` or ``HookedTransformer`` hook points.
"""
