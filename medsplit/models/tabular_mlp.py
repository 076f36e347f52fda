"""A small multilayer perceptron for a table of numeric features (a lab's blood panel, say)."""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from medsplit.models.args import check_build_args

#: Width of every hidden layer.
HIDDEN = 64


def tabular_mlp(
    *, spatial_dims: int = 2, in_channels: int = 16, num_classes: int = 2
) -> nn.Sequential:
    """Three hidden blocks (linear, layer norm, ReLU) and a linear classifier.

    Every stage is a named child of one ``nn.Sequential`` (``block1``, ``block2``,
    ``block3``, ``fc``), so a cut after any of them sends one ``(N, 64)`` embedding: what
    a vertical job joins with an image party's flattened features.

    Args:
        spatial_dims: checked like every registry model's, not used (a table has no
            spatial dimensions).
        in_channels: the number of feature columns; one input is a ``(in_channels,)``
            row of floats.
        num_classes: number of output logits.
    """
    check_build_args(spatial_dims=spatial_dims, in_channels=in_channels, num_classes=num_classes)

    def block(cin: int) -> nn.Sequential:
        # Layer norm, not batch norm: each record is normalised on its own, so no
        # running statistics depend on which other patients share its batch.
        return nn.Sequential(nn.Linear(cin, HIDDEN), nn.LayerNorm(HIDDEN), nn.ReLU())

    return nn.Sequential(
        OrderedDict(
            block1=block(in_channels),
            block2=block(HIDDEN),
            block3=block(HIDDEN),
            fc=nn.Linear(HIDDEN, num_classes),
        )
    )
