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

from .base import SteeringData, SteeringMethod, SteeringVector
from .refusal import default_data
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


class DirectionalAblation(SteeringMethod):
    """Project the difference-in-means direction out of every layer's residual stream."""

    name = "directional_ablation"
    config_class = DirectionalAblationConfig

    def fit(self, model, data: SteeringData | None = None, val: SteeringData | None = None) -> SteeringVector:
        """Fit on ``data`` (``None``: the built-in harmful vs harmless set, :func:`steering.refusal.default_data`);
        ``val`` is unused."""
        c = self.config
        data = default_data(model) if data is None else data
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
def orthogonalize_weights(model, direction: torch.Tensor | SteeringVector) -> list[str]:
    """Bake directional ablation of ``direction`` into the model's weights (IN PLACE).

    Every weight that writes into the residual stream (token and learned position embeddings, each
    block's attention output and MLP output projections, biases included) is projected off ``r_hat``,
    ``W <- W - r_hat r_hat^T W``, through the capture layer's
    :meth:`interp.Model.project_out_of_residual_writers` (a tied unembedding is untied first and keeps its
    weights, because the final norm's gain can rotate an ``r_hat``-free residual back onto ``r_hat``). The
    result equals :class:`DirectionalAblation`'s activation-level ablation (tested on a tiny Llama, tied
    and untied, and GPT-2). Architectures that normalise or rescale a sub-layer's output before the
    residual add (Gemma-2/3 post-norms, DINOv2 layer scale, post-norm BERT), and the TransformerLens
    backend, raise ``ValueError``.

    Returns the edited weights' module paths.
    """
    if isinstance(direction, SteeringVector):
        if direction.direction.dim() != 1:
            raise ValueError("orthogonalize_weights needs a single direction [d]")
        direction = direction.direction
    return model.project_out_of_residual_writers(direction)
