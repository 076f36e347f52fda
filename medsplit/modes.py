"""The split-learning modes MedSplit knows."""

from enum import StrEnum


class Mode(StrEnum):
    """How the network is split between hospitals and the server.

    ``VANILLA``: labels go to the server. ``USHAPED``: labels and the head stay home.
    ``VERTICAL`` and ``SPLITFED`` are reserved names for modes built later.
    """

    VANILLA = "vanilla"
    USHAPED = "ushaped"
    VERTICAL = "vertical"
    SPLITFED = "splitfed"
