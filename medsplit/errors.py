"""One error hierarchy for the core library.

Every error a caller can act on derives from :class:`MedSplitError`; each message says
what was wrong and, where it helps, what to do instead.
"""


class MedSplitError(Exception):
    """Base class of every error raised on purpose by ``medsplit``."""


class CutError(MedSplitError, ValueError):
    """A model cannot be cut where asked (untraceable, unknown name, raw input crossing)."""


class UnknownModelError(MedSplitError, LookupError):
    """A model name is not in the registry."""


class ModelModuleRefused(UnknownModelError):
    """A ``MODULE:FACTORY`` model whose module this party does not list: refused before
    the module is imported (the message names the module and the setting that lists)."""


class FrameError(MedSplitError, ValueError):
    """Bytes received from another party are not a valid frame (or not the expected one)."""


class CodecError(MedSplitError, ValueError):
    """A tensor cannot be encoded with the chosen codec (for example, it overflows fp16)."""


class ChannelError(MedSplitError):
    """The channel between two parties failed."""


class ChannelTimeout(ChannelError, TimeoutError):
    """No frame arrived on a stream within the timeout."""


class RelayAbuse(ChannelError):
    """A sender put more on the relay than the job allows (an oversized frame, a flooded
    stream, junk under its keys): its fault, not the relay's.

    Attributes:
        stream: the stream or key where it was found.
    """

    def __init__(self, message: str, *, stream: str = "") -> None:
        super().__init__(message)
        self.stream = stream


class ProtocolError(MedSplitError):
    """A frame arrived that the protocol did not expect at this point (order, kind, ids)."""


class HandoffError(MedSplitError, ValueError):
    """Weights handed on between hospitals do not fit the segment they are loaded into."""


class DataError(MedSplitError, ValueError):
    """Local data cannot be used (missing file, wrong keys, labels out of range)."""


class ConfigError(MedSplitError, ValueError):
    """A training configuration value is invalid."""


class SealError(MedSplitError, ValueError):
    """A sealed hand-off cannot be made or opened (not a blob, replayed, altered, wrong keys)."""


class UnknownModeError(ConfigError, LookupError):
    """A mode name is not in the mode registry (the message lists the known ones)."""


class ModeLoadError(ConfigError):
    """An extra mode named in the configuration cannot be imported or is not a mode."""


class RoundPlanError(MedSplitError):
    """A mode was asked for a round step its plan does not take (combining the states of
    a group in a round-robin mode, say)."""
