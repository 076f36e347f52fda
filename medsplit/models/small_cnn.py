"""A small CNN that trains in seconds on a CPU, for tests, demos and benchmarks."""

from __future__ import annotations

from collections import OrderedDict

from monai.networks.blocks import Convolution
from monai.networks.layers.factories import Pool
from torch import nn

from medsplit.models.args import check_build_args

# GroupNorm rather than BatchNorm: it normalises each sample on its own, so a hospital's
# batch of one still trains, there are no running statistics to hand on between
# hospitals, and per-sample gradients (differential privacy) stay well defined.
_NORM = ("group", {"num_groups": 4})


def small_cnn(
    *, spatial_dims: int = 2, in_channels: int = 1, num_classes: int = 2
) -> nn.Sequential:
    """Three convolution blocks, global average pooling and a linear classifier.

    Every stage is a named child of one ``nn.Sequential`` (``conv1``, ``pool1``,
    ``conv2``, ``pool2``, ``conv3``, ``pool``, ``flatten``, ``fc``), so a cut after any
    of them has exactly one tensor crossing it.

    Args:
        spatial_dims: 2 for images, 3 for volumes.
        in_channels: input channels.
        num_classes: number of output logits.

    Returns:
        The network, about 23k parameters for one input channel.

    Note:
        Any spatial size of at least 4 per dimension works (two 2x max-poolings, then
        adaptive pooling), e.g. 1x28x28, 1x64x64 or a 1x8x8x8 volume.
    """
    check_build_args(spatial_dims=spatial_dims, in_channels=in_channels, num_classes=num_classes)

    def block(cin: int, cout: int) -> Convolution:
        # No conv bias: the normalisation right after it would cancel most of it.
        return Convolution(
            spatial_dims, cin, cout, kernel_size=3, act="relu", norm=_NORM, bias=False
        )

    max_pool = Pool[Pool.MAX, spatial_dims]
    return nn.Sequential(
        OrderedDict(
            conv1=block(in_channels, 16),
            pool1=max_pool(kernel_size=2),
            conv2=block(16, 32),
            pool2=max_pool(kernel_size=2),
            conv3=block(32, 64),
            pool=Pool[Pool.ADAPTIVEAVG, spatial_dims](1),
            flatten=nn.Flatten(),
            fc=nn.Linear(64, num_classes),
        )
    )
