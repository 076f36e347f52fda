"""Which segment each party holds in each mode, and the roles that run them."""

from __future__ import annotations

from collections.abc import Mapping

from medsplit.cutting import SplitModel
from medsplit.errors import ConfigError
from medsplit.modes import Mode
from medsplit.protocol.checks import FrameLimits
from medsplit.protocol.party import Party
from medsplit.protocol.roles import ClientRole, LossFn, ServerRole
from medsplit.protocol.ushaped import UShapedClient, UShapedServer
from medsplit.protocol.vanilla import VanillaClient, VanillaServer

# Party name -> segment index. The server always holds segment 1.
CLIENT_SEGMENTS: dict[Mode, dict[str, int]] = {
    Mode.VANILLA: {"front": 0},
    Mode.USHAPED: {"front": 0, "head": 2},
}
SERVER_SEGMENT = 1


def client_segments(mode: Mode) -> dict[str, int]:
    """The segments a hospital holds in ``mode``, by party name."""
    try:
        return CLIENT_SEGMENTS[Mode(mode)]
    except (KeyError, ValueError):
        raise ConfigError(f"mode {mode!r} has no client layout yet") from None


def make_client(
    mode: Mode,
    parties: Mapping[str, Party],
    split: SplitModel,
    *,
    codec: str = "none",
    loss_fn: LossFn | None = None,
) -> ClientRole:
    """The hospital's role for ``mode`` over its parties."""
    if mode == Mode.VANILLA:
        return VanillaClient(front=parties["front"], boundary=split.boundaries[0], codec=codec)
    if mode == Mode.USHAPED:
        return UShapedClient(
            front=parties["front"],
            head=parties["head"],
            boundaries=(split.boundaries[0], split.boundaries[1]),
            loss_fn=loss_fn,
            codec=codec,
        )
    raise ConfigError(f"mode {mode!r} has no client role yet")


def make_server(
    mode: Mode,
    party: Party,
    split: SplitModel,
    *,
    job: str,
    codec: str = "none",
    loss_fn: LossFn | None = None,
    limits: FrameLimits | None = None,
) -> ServerRole:
    """The server's role for ``mode`` over its party; ``limits`` bound what frames hold."""
    if mode == Mode.VANILLA:
        return VanillaServer(
            back=party,
            boundary=split.boundaries[0],
            job=job,
            loss_fn=loss_fn,
            codec=codec,
            limits=limits,
        )
    if mode == Mode.USHAPED:
        return UShapedServer(
            middle=party,
            boundaries=(split.boundaries[0], split.boundaries[1]),
            job=job,
            codec=codec,
            limits=limits,
        )
    raise ConfigError(f"mode {mode!r} has no server role yet")
