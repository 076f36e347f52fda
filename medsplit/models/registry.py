"""The model registry: every network MedSplit can train, by name.

Each entry says how to build the network and where it is sensible to cut it, so the
coordinator, the workers and the hospital agents all build the same model from a name and
a seed, and a job's configuration never has to carry code.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import torch
from monai.networks.nets import DenseNet121, resnet18, resnet34
from torch import nn

from medsplit.errors import ConfigError, UnknownModelError
from medsplit.models.args import check_build_args, is_int
from medsplit.models.factory import build_factory_model, is_factory_name
from medsplit.models.skip_net import SkipNet
from medsplit.models.small_cnn import small_cnn
from medsplit.models.tabular_mlp import tabular_mlp
from medsplit.models.unet import unet


@dataclass(frozen=True)
class ModelSpec:
    """What the registry knows about one model.

    Attributes:
        name: registry name, e.g. ``"resnet18"``.
        description: one line for people, naming the paper where there is one.
        default_input_shape: ``(C, H, W)`` of one 2D input the model is meant for.
        default_cut: qualified name of the submodule after which a split into two
            segments cuts by default.
        default_cut_pair: ``(cut1, cut2)`` for a split into three segments: the first
            up to ``cut1``, the middle up to ``cut2``, the last after ``cut2``. Chosen so
            that each of the three segments has parameters.
        build: private builder ``build(*, spatial_dims, in_channels, num_classes)``; call
            :func:`build_model` instead, which validates and seeds.
        tasks: the tasks (:data:`medsplit.training.tasks.TASKS`) the model's output
            fits: ``classification`` for ``(N, num_classes)`` logits, ``segmentation``
            for ``(N, num_classes, *spatial)``.
    """

    name: str
    description: str
    default_input_shape: tuple[int, ...]
    default_cut: str
    default_cut_pair: tuple[str, str]
    build: Callable[..., nn.Module]
    tasks: tuple[str, ...] = ("classification",)

    def default_cuts(self, count: int) -> tuple[str, ...]:
        """The default cuts for a split into ``count + 1`` segments (a mode picks the
        count: :meth:`medsplit.modes.SplitMode.default_cuts`).

        Raises:
            ConfigError: the registry has no default for that many cuts.
        """
        defaults = {1: (self.default_cut,), 2: self.default_cut_pair}
        if count not in defaults:
            raise ConfigError(
                f"{self.name} has default cuts for 1 or 2 cuts, not {count}; give the cuts"
            )
        return defaults[count]


def _build_densenet121(*, spatial_dims: int, in_channels: int, num_classes: int) -> nn.Module:
    return DenseNet121(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=num_classes)


def _build_resnet18(*, spatial_dims: int, in_channels: int, num_classes: int) -> nn.Module:
    return resnet18(
        spatial_dims=spatial_dims, n_input_channels=in_channels, num_classes=num_classes
    )


def _build_resnet34(*, spatial_dims: int, in_channels: int, num_classes: int) -> nn.Module:
    return resnet34(
        spatial_dims=spatial_dims, n_input_channels=in_channels, num_classes=num_classes
    )


def _build_small_cnn(*, spatial_dims: int, in_channels: int, num_classes: int) -> nn.Module:
    return small_cnn(spatial_dims=spatial_dims, in_channels=in_channels, num_classes=num_classes)


def _build_tabular_mlp(*, spatial_dims: int, in_channels: int, num_classes: int) -> nn.Module:
    return tabular_mlp(spatial_dims=spatial_dims, in_channels=in_channels, num_classes=num_classes)


def _build_unet(*, spatial_dims: int, in_channels: int, num_classes: int) -> nn.Module:
    return unet(spatial_dims=spatial_dims, in_channels=in_channels, num_classes=num_classes)


def _build_skip_net(*, spatial_dims: int, in_channels: int, num_classes: int) -> nn.Module:
    return SkipNet(spatial_dims=spatial_dims, in_channels=in_channels, num_classes=num_classes)


# Cuts are chosen where the activation is small (after a pooling or strided stage) and
# every segment keeps parameters. DenseNet121 halves its input five times, so inputs
# smaller than 32x32 fail in its last transition; its default input is therefore 64x64.
_SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="densenet121",
            description="MONAI DenseNet121 (Huang et al., 2017, 'Densely Connected "
            "Convolutional Networks')",
            default_input_shape=(1, 64, 64),
            default_cut="features.transition1",
            default_cut_pair=("features.transition1", "features.norm5"),
            build=_build_densenet121,
        ),
        ModelSpec(
            name="resnet18",
            description="MONAI ResNet-18 (He et al., 2016, 'Deep Residual Learning for "
            "Image Recognition')",
            default_input_shape=(1, 28, 28),
            default_cut="layer1",
            default_cut_pair=("layer1", "layer4"),
            build=_build_resnet18,
        ),
        ModelSpec(
            name="resnet34",
            description="MONAI ResNet-34 (He et al., 2016, 'Deep Residual Learning for "
            "Image Recognition')",
            default_input_shape=(1, 28, 28),
            default_cut="layer1",
            default_cut_pair=("layer1", "layer4"),
            build=_build_resnet34,
        ),
        ModelSpec(
            name="small_cnn",
            description="Small three-block CNN from MONAI Convolution blocks (fast on CPU)",
            default_input_shape=(1, 28, 28),
            default_cut="pool1",
            default_cut_pair=("pool1", "pool"),
            build=_build_small_cnn,
        ),
        ModelSpec(
            name="skip_net",
            description="Small CNN with a long skip connection (two tensors cross a cut "
            "after block1 or block2)",
            default_input_shape=(1, 28, 28),
            default_cut="block1",
            default_cut_pair=("block1", "block3"),
            build=_build_skip_net,
        ),
        ModelSpec(
            name="tabular_mlp",
            description="Multilayer perceptron for a table of numeric features "
            "(in_channels is the number of columns); a vertical job's tabular party",
            default_input_shape=(16,),
            default_cut="block1",
            default_cut_pair=("block1", "block3"),
            build=_build_tabular_mlp,
        ),
        ModelSpec(
            name="unet",
            description="MONAI UNet (Ronneberger et al., 2015, 'U-Net: Convolutional "
            "Networks for Biomedical Image Segmentation'), channels 16-32-64, two "
            "halvings (sides a multiple of 4); a segmentation model",
            default_input_shape=(1, 64, 64),
            # Cut in the encoder's second level: both skip tensors cross (the first
            # level's and the second's); U-shaped keeps the last layer, and the masks,
            # at the hospital.
            default_cut="model.skip.submodule.down",
            default_cut_pair=("model.skip.submodule.down", "model.skip"),
            build=_build_unet,
            tasks=("segmentation",),
        ),
    )
}


def model_names() -> list[str]:
    """Names of all registered models, in registration order."""
    return list(_SPECS)


def get_model_spec(name: str) -> ModelSpec:
    """The :class:`ModelSpec` registered under ``name``.

    Raises:
        UnknownModelError: ``name`` is not registered; the message lists the known names.
    """
    try:
        return _SPECS[name]
    except (KeyError, TypeError):  # TypeError: an unhashable name such as a list
        known = ", ".join(_SPECS)
        raise UnknownModelError(f"unknown model {name!r}; known models: {known}") from None


def build_model(
    name: str,
    *,
    spatial_dims: int = 2,
    in_channels: int | None = None,
    num_classes: int = 2,
    seed: int | None = None,
) -> nn.Module:
    """Build a registered model, deterministically when a seed is given.

    Args:
        name: a name from :func:`model_names`.
        spatial_dims: 2 for images, 3 for volumes.
        in_channels: channels of the input (1 for grey scale, 3 for RGB; a tabular
            model's feature columns); by default those of the model's default input.
        num_classes: number of output logits, at least 2.
        seed: with a seed, two builds give identical weights; the global torch RNG is
            left as it was. ``None`` draws from the global RNG like any torch module.

    Returns:
        A freshly initialised ``torch.nn.Module`` in training mode, on the CPU.

    Raises:
        UnknownModelError: ``name`` is not registered.
        ConfigError: an argument is out of range (the message names it).
    """
    spec = get_model_spec(name)
    if in_channels is None:
        in_channels = spec.default_input_shape[0]
    check_build_args(spatial_dims=spatial_dims, in_channels=in_channels, num_classes=num_classes)
    if seed is not None and (not is_int(seed) or seed < 0):
        raise ConfigError(f"seed must be None or an integer >= 0, got {seed!r}")
    if seed is None:
        return spec.build(
            spatial_dims=spatial_dims, in_channels=in_channels, num_classes=num_classes
        )
    # Models are built on the CPU, so only the CPU generator needs saving; forking CUDA
    # generators too would initialise CUDA for nothing.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return spec.build(
            spatial_dims=spatial_dims, in_channels=in_channels, num_classes=num_classes
        )


def build_any_model(
    name: str,
    *,
    model_args: Mapping[str, object] | None = None,
    allowed_modules: Collection[str] | None = None,
    spatial_dims: int = 2,
    in_channels: int | None = None,
    num_classes: int = 2,
    seed: int | None = None,
) -> nn.Module:
    """A registry model by name, or a ``MODULE:FACTORY`` model from its JSON arguments
    (:func:`medsplit.models.factory.build_factory_model`; the input and class counts
    are then the factory's own arguments).

    Raises:
        UnknownModelError: an unknown name, or a module ``allowed_modules`` leaves out.
        ConfigError: an argument is out of range, or arguments given to a registry model.
    """
    if is_factory_name(name):
        return build_factory_model(
            name, model_args or {}, allowed_modules=allowed_modules, seed=seed
        )
    if model_args:
        raise ConfigError(
            f"{name} is a registry model: it takes no model arguments (they are for "
            "MODULE:FACTORY models)"
        )
    return build_model(
        name, spatial_dims=spatial_dims, in_channels=in_channels, num_classes=num_classes, seed=seed
    )
