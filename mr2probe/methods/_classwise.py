"""Helpers shared by the re-weighting baselines: class-wise batch means and training-set class priors."""
from __future__ import annotations

import torch


def class_means(values: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of ``values`` [h, B] over the batch samples of each class → (means [h, K], present [K] bool).

    A class absent from the batch has mean 0 and ``present`` False."""
    onehot = torch.nn.functional.one_hot(y, num_classes).to(values.dtype)  # [B, K]
    counts = onehot.sum(0)
    return (values @ onehot) / counts.clamp_min(1), counts > 0


def per_class_accuracy(logits: torch.Tensor, y: torch.Tensor, num_classes: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Accuracy of each head on each class: logits [h, n, K], y [n] → (acc [h, K], present [K] bool)."""
    correct = (logits.argmax(-1) == y).to(logits.dtype)  # [h, n]
    return class_means(correct, y, num_classes)
