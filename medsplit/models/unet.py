"""MONAI's UNet with its connection blocks' parts named, so that its cuts read plainly."""

from __future__ import annotations

from collections import OrderedDict

from monai.networks.layers import SkipConnection
from monai.networks.nets import UNet
from torch import nn

from medsplit.models.args import check_build_args

#: Channels per level and the strides between levels: two halvings (an input side must
#: be a multiple of 4), about 0.1 M parameters; small enough to train on a CPU.
CHANNELS = (16, 32, 64)
STRIDES = (2, 2)


class NamedUNet(UNet):
    """``monai.networks.nets.UNet`` (Ronneberger et al., 2015) whose levels are
    ``Sequential(down=..., skip=SkipConnection(...), up=...)`` rather than MONAI's
    ``Sequential(0, 1, 2)``: the same layers, in the same order, with the same
    initialisation, under names a cut can say.

    With two halvings the cuts are, in forward order: ``model.down`` (the first encoder
    level), ``model.skip.submodule.down`` (the second), ``model.skip.submodule.skip.submodule``
    (the bottom), ``model.skip.submodule.skip`` (the bottom's output joined to the second
    level's skip), ``model.skip.submodule`` (the second decoder level), ``model.skip``
    (joined to the first level's skip) and ``model.up`` (the last layer). An encoder cut
    sends every skip tensor whose level lies before it.
    """

    def _get_connection_block(
        self, down_path: nn.Module, up_path: nn.Module, subblock: nn.Module
    ) -> nn.Module:
        return nn.Sequential(OrderedDict(down=down_path, skip=SkipConnection(subblock), up=up_path))


def unet(*, spatial_dims: int = 2, in_channels: int = 1, num_classes: int = 2) -> NamedUNet:
    """The registry's ``unet``: :class:`NamedUNet` with :data:`CHANNELS` and
    :data:`STRIDES`, no residual units, instance norm (per sample: batches of one train,
    no running statistics) and ``num_classes`` output channels of logits."""
    check_build_args(spatial_dims=spatial_dims, in_channels=in_channels, num_classes=num_classes)
    return NamedUNet(
        spatial_dims=spatial_dims,
        in_channels=in_channels,
        out_channels=num_classes,
        channels=CHANNELS,
        strides=STRIDES,
        num_res_units=0,
    )
