"""The arguments every model builder takes, checked the same way for every model."""

from __future__ import annotations

from medsplit.errors import ConfigError


def check_build_args(*, spatial_dims: int, in_channels: int, num_classes: int) -> None:
    """Check the arguments every registry builder takes.

    Raises:
        ConfigError: naming the argument and the values it accepts.
    """
    if not is_int(spatial_dims) or spatial_dims not in (2, 3):
        raise ConfigError(f"spatial_dims must be 2 or 3, got {spatial_dims!r}")
    if not is_int(in_channels) or in_channels < 1:
        raise ConfigError(f"in_channels must be an integer >= 1, got {in_channels!r}")
    if not is_int(num_classes) or num_classes < 2:
        raise ConfigError(f"num_classes must be an integer >= 2, got {num_classes!r}")


def is_int(value: object) -> bool:
    """An ``int`` that is not a ``bool``."""
    # bool is an int subclass; True as a channel count is a bug, not a 1.
    return isinstance(value, int) and not isinstance(value, bool)
