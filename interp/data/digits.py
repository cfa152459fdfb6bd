"""Real images for vision analyzers and recipes: the 1,797 scikit-learn handwritten digits (8x8 grey, ten classes),
as image tensors a vision transformer takes.

``digits_images(size)`` upsamples them bilinearly, replicates the grey channel and applies the ImageNet
normalisation (as DINOv2 and HF ViT processors do); ``digits_images(8, channels=1, normalize=False)`` gives the
raw 8x8 images in [0, 1]. The data ship with scikit-learn (no download).
"""
from __future__ import annotations

import numpy as np
import torch

#: ImageNet normalisation per channel, ``[3, 1, 1]``
IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225])[:, None, None]

N_DIGITS = 1797


def digits_images(size: int = 56, channels: int = 3, normalize: bool = True) -> tuple[torch.Tensor, np.ndarray]:
    """The 1,797 real 8x8 scikit-learn digits as ``[1797, channels, size, size]`` float32 (pixel values in [0, 1]
    before normalisation; bilinear upsampling when ``size != 8``; grey replicated over ``channels``; ImageNet
    normalisation when ``normalize`` and ``channels == 3``) and their labels ``[1797]`` (ints 0-9)."""
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive integer (pixels), got {size!r}")
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels!r}")
    if normalize and channels != 3:
        raise ValueError("the ImageNet normalisation needs channels=3 (pass normalize=False for 1 channel)")
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0
    if size != 8:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = x.expand(-1, channels, -1, -1).contiguous()
    if normalize:
        x = (x - IMAGENET_MEAN) / IMAGENET_STD
    return x, d.target


#: the default sample of vision analyzers called without images (the ``raptor`` audit check's): images and side
DEFAULT_N_IMAGES = 200
DEFAULT_IMAGE_SIZE = 56


def _accepts(model, size: int) -> bool:
    try:
        model(torch.zeros(1, 3, size, size))
    except (ValueError, RuntimeError):
        return False
    return True


def digits_sample(model=None, n: int = DEFAULT_N_IMAGES, size: int | None = None) -> tuple[torch.Tensor, np.ndarray]:
    """``(images [n, 3, s, s], labels [n])``: the first ``n`` digits of a fixed permutation
    (``numpy.random.default_rng(0)``), ImageNet-normalised, with their labels (0-9): the built-in images of the
    vision analyzers called without images.

    The side ``s``: ``size`` when given; else :data:`DEFAULT_IMAGE_SIZE` (56 px, a multiple of the patch sizes 8
    and 14) when ``model`` is None or takes it (one probe forward: DINOv2 interpolates its position embeddings),
    else the ``model.cfg.image_size`` its position embeddings were built for (an HF ViT takes only that).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if size is None:
        size = DEFAULT_IMAGE_SIZE
        own = getattr(getattr(model, "cfg", None), "image_size", None)
        if model is not None and own and own != size and not _accepts(model, size):
            size = int(own)
    x, y = digits_images(size)
    idx = np.random.default_rng(0).permutation(len(y))[:n]
    return x[idx], y[idx]


__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "N_DIGITS", "DEFAULT_N_IMAGES", "DEFAULT_IMAGE_SIZE", "digits_images",
           "digits_sample"]
