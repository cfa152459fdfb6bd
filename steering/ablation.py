"""Directional ablation (Arditi et al., 2024, "Refusal in language models is mediated by a single direction").

The direction ``r_hat`` (the normalised difference-in-means vector of one layer and position) is projected out
of the residual stream EVERYWHERE: at the input of every block (``blocks.{l}.hook_resid_pre``) and from every
write into the stream (``blocks.{l}.hook_attn_out``, ``blocks.{l}.hook_mlp_out``), at every position,
``x <- x - (x . r_hat) r_hat``. Then no residual-stream activation at any layer has a component along
``r_hat``.

The same edit can be baked into the weights (:func:`orthogonalize_weights`): every matrix that writes into
the residual stream (token and learned position embeddings, the attention output projections, the MLP down
projections, and their biases) is replaced by ``W <- W - r_hat r_hat^T W``. Since the stream is then a sum of
terms without an ``r_hat`` component, the edited model computes exactly what the activation-level ablation
computes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .base import SteeringData, SteeringMethod, SteeringVector, register
from .diff_in_means import fit_direction

#: The hooks at which :class:`DirectionalAblation` projects the direction out (every layer).
ABLATION_HOOKS: tuple[str, ...] = ("blocks.*.hook_resid_pre", "blocks.*.hook_attn_out", "blocks.*.hook_mlp_out")


@dataclass
class DirectionalAblationConfig:
    """Options of :class:`DirectionalAblation`: where the difference-in-means direction is read
    (``layer=None``: ``n_layers // 2``; ``position=-1``: last prompt token)."""

    layer: int | None = None
    position: int = -1
    hook: str = "hook_resid_pre"
    batch_size: int = 16


@register
class DirectionalAblation(SteeringMethod):
    """Project the difference-in-means direction out of every layer's residual stream."""

    name = "directional_ablation"
    config_class = DirectionalAblationConfig

    def fit(self, model, data: SteeringData, val: SteeringData | None = None) -> SteeringVector:
        c = self.config
        layer = model.cfg.n_layers // 2 if c.layer is None else int(c.layer)
        r, mu_pos, mu_neg = fit_direction(model, data, layer, c.position, c.hook, c.batch_size)
        return ablation_vector(r, source_layer=layer, position=c.position, hook=c.hook,
                               tensors={"raw_direction": r, "positive_mean": mu_pos, "negative_mean": mu_neg})


def ablation_vector(direction: torch.Tensor, source_layer: int | None = None, position: int | None = None,
                    hook: str = "hook_resid_pre", tensors: dict | None = None,
                    method: str = DirectionalAblation.name) -> SteeringVector:
    """A :class:`SteeringVector` that projects ``direction`` ``[d]`` out at :data:`ABLATION_HOOKS`."""
    r = torch.as_tensor(direction).float()
    if r.dim() != 1 or r.norm() == 0:
        raise ValueError(f"direction must be a non-zero vector [d], got shape {tuple(r.shape)}")
    return SteeringVector(method=method, operation="project_out", hooks=ABLATION_HOOKS, direction=r / r.norm(),
                          positions=None, tensors=dict(tensors or {}),
                          metadata={"layer": source_layer, "position": position, "hook": hook})


# ------------------------------------------------------------------------------------- weight editing
def _orth_out(module: nn.Module, r_hat: torch.Tensor) -> None:
    """Make the OUTPUT of a linear map orthogonal to ``r_hat`` (``nn.Linear``: ``W [out, in]``;
    GPT-2 ``Conv1D``: ``W [in, out]``), bias included."""
    w = module.weight
    r = r_hat.to(w.device, torch.float32)
    with torch.no_grad():
        if type(module).__name__ == "Conv1D":  # y = x W + b, W [in, out]
            wf = w.float()
            w.copy_((wf - (wf @ r)[:, None] * r[None, :]).to(w.dtype))
        elif isinstance(module, nn.Linear):
            wf = w.float()
            w.copy_((wf - r[:, None] * (r @ wf)[None, :]).to(w.dtype))
        else:
            raise TypeError(f"cannot orthogonalise a {type(module).__name__} (expected nn.Linear or Conv1D)")
        b = getattr(module, "bias", None)
        if b is not None:
            bf = b.float()
            b.copy_((bf - (bf @ r) * r).to(b.dtype))


def _orth_embedding(emb: nn.Embedding, r_hat: torch.Tensor) -> None:
    with torch.no_grad():
        w = emb.weight
        r = r_hat.to(w.device, torch.float32)
        wf = w.float()
        w.copy_((wf - (wf @ r)[:, None] * r[None, :]).to(w.dtype))


def orthogonalize_weights(model, direction: torch.Tensor | SteeringVector) -> list[str]:
    """Bake directional ablation of ``direction`` into the weights of ``model.hf_model`` (IN PLACE).

    Edits every module that writes into the residual stream, ``W <- W - r_hat r_hat^T W`` on its output side:

    * the token embedding (``model.spec.embed``) and any learned absolute position embedding of width
      ``d_model`` outside the blocks (GPT-2's ``wpe``);
    * each block's attention output projection (``model.spec.o``) and MLP down projection
      (``model.spec.mlp_out``), biases included.

    A tied output embedding is untied first (the unembedding keeps its original weights), because the final
    norm's gain can rotate an ``r_hat``-free residual back onto ``r_hat``, so the unembedding must not change.
    The result equals :class:`DirectionalAblation`'s activation-level ablation (tested on a tiny Llama).

    Needs an HF backend (``torch`` or ``nnsight``): ``model.hf_model`` and ``model.spec``. Architectures that
    normalise a sub-layer's output before adding it to the stream (Gemma-2/3 post-norms, DINOv2 layer scale)
    or post-norm models (BERT) cannot be edited this way and raise ``ValueError``.

    Returns the module paths that were edited.
    """
    if isinstance(direction, SteeringVector):
        if direction.direction.dim() != 1:
            raise ValueError("orthogonalize_weights needs a single direction [d]")
        direction = direction.direction
    spec = getattr(model, "spec", None)
    hf = getattr(model, "hf_model", None)
    if spec is None or hf is None:
        raise ValueError(f"orthogonalize_weights edits Hugging Face weights: load the model with backend='torch' "
                         f"or 'nnsight' (got backend={getattr(model, 'backend', '?')!r})")
    if spec.attn_out_norm or spec.mlp_out_norm or spec.resid_mid_from:
        raise ValueError(f"{spec.family!r} normalises or rescales sub-layer outputs before the residual add "
                         "(post-norms / layer scale), so weight orthogonalisation is not equivalent to "
                         "directional ablation there; use the activation-level DirectionalAblation vector")
    r = torch.as_tensor(direction, dtype=torch.float32).detach().cpu()
    if r.shape != (spec.d_model,):
        raise ValueError(f"direction has shape {tuple(r.shape)}, expected [{spec.d_model}]")
    if r.norm() == 0 or not torch.isfinite(r).all():
        raise ValueError("direction must be finite and non-zero")
    r_hat = r / r.norm()

    edited: list[str] = []
    out_emb = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    if out_emb is not None and spec.embed is not None:
        in_emb = hf.get_submodule(spec.embed)
        if getattr(out_emb, "weight", None) is not None and out_emb.weight is getattr(in_emb, "weight", None):
            out_emb.weight = nn.Parameter(out_emb.weight.detach().clone(), requires_grad=out_emb.weight.requires_grad)
            for cfg in {id(c): c for c in (hf.config, getattr(hf.config, "get_text_config", lambda: None)())
                        if c is not None}.values():
                if hasattr(cfg, "tie_word_embeddings"):
                    cfg.tie_word_embeddings = False
            edited.append("(untied output embedding)")
    blocks_prefix = spec.blocks + "."
    for path, module in hf.named_modules():
        if isinstance(module, nn.Embedding) and module.embedding_dim == spec.d_model \
                and not path.startswith(blocks_prefix) and module is not out_emb:
            _orth_embedding(module, r_hat)
            edited.append(path)
    for layer in range(spec.n_layers):
        for sub in (spec.o, spec.mlp_out):
            path = f"{spec.blocks}.{layer}.{sub}"
            _orth_out(hf.get_submodule(path), r_hat)
            edited.append(path)
    return edited
