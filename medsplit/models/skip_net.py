"""A small CNN with a long skip connection, to exercise cuts that several tensors cross."""

from __future__ import annotations

from collections import OrderedDict

import torch
from monai.networks.blocks import Convolution
from monai.networks.layers.factories import Pool
from torch import nn

from medsplit.models.args import check_build_args

# Per-sample normalisation for the same reasons as in small_cnn: batches of one train,
# no running statistics, per-sample gradients are well defined.
_NORM = ("group", {"num_groups": 4})


class SkipNet(nn.Module):
    """``stem -> block1 -> block2 -> cat(., skip(stem)) -> block3 -> head``.

    The stem's output is used twice: by ``block1`` and, down-sampled by ``skip``, once
    more after ``block2``, where it is concatenated on the channel axis. So a cut after
    ``block1`` or after ``block2`` has two tensors crossing it (the stem's output and the
    main path's), while a cut after ``stem``, ``block3`` or ``head`` has one.

    Args:
        spatial_dims: 2 for images, 3 for volumes.
        in_channels: input channels.
        num_classes: number of output logits.

    Note:
        ``stem`` and ``block1`` are stride-2 convolutions (``ceil(H/2)``, then
        ``ceil(H/4)``); ``block2`` keeps the size, and ``skip`` is a 2x average pooling
        with ``ceil_mode``, so the two paths line up for any size of at least 2, e.g.
        1x28x28, 1x64x64, odd sizes, or a 1x8x8x8 volume. The stem already halves the
        image so the extra tensor crossing a cut is a quarter of the raw pixel count per
        channel. About 70k parameters for one input channel. Forward has no
        data-dependent control flow, so ``torch.fx`` traces it.
    """

    def __init__(self, *, spatial_dims: int = 2, in_channels: int = 1, num_classes: int = 2):
        super().__init__()
        check_build_args(
            spatial_dims=spatial_dims, in_channels=in_channels, num_classes=num_classes
        )

        def block(cin: int, cout: int, strides: int) -> Convolution:
            return Convolution(
                spatial_dims,
                cin,
                cout,
                strides=strides,
                kernel_size=3,
                act="relu",
                norm=_NORM,
                bias=False,
            )

        # Registration order follows execution order, so module order and graph order
        # agree about what lies before and after a cut.
        self.stem = block(in_channels, 16, strides=2)
        self.block1 = block(16, 32, strides=2)
        self.block2 = block(32, 64, strides=1)
        self.skip = Pool[Pool.AVG, spatial_dims](kernel_size=2, stride=2, ceil_mode=True)
        self.block3 = block(64 + 16, 64, strides=1)
        self.head = nn.Sequential(
            OrderedDict(
                pool=Pool[Pool.ADAPTIVEAVG, spatial_dims](1),
                flatten=nn.Flatten(),
                fc=nn.Linear(64, num_classes),
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.stem(x)
        a = self.block1(s)
        b = self.block2(a)
        # The long skip: the stem's output re-enters here, down-sampled like block1's.
        b = torch.cat([b, self.skip(s)], dim=1)
        c = self.block3(b)
        return self.head(c)
