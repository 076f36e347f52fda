"""Split-learning modes: one interface (:class:`SplitMode`), one file per mode, a registry.

Everything that depends on the mode (the segments each party holds, who holds the
labels, the step roles, how validation crosses the cut, the number of cuts, the round
plan) is asked of the job's mode through this interface; see ``docs/design.md#modes``.
"""

from medsplit.modes.base import (
    SERVER_PARTY,
    GroupServer,
    ModeConfiguration,
    ModeDescription,
    ModeOption,
    SegmentRole,
    Side,
    SplitMode,
    StartFrom,
)
from medsplit.modes.registry import (
    DEFAULT_LABELS_HOME_MODE,
    DEFAULT_MODE,
    MODES,
    get_mode,
    load_extra_modes,
    mode_names,
    mode_paths,
    register,
    require_mode,
)

__all__ = [
    "DEFAULT_LABELS_HOME_MODE",
    "DEFAULT_MODE",
    "MODES",
    "SERVER_PARTY",
    "GroupServer",
    "ModeConfiguration",
    "ModeDescription",
    "ModeOption",
    "SegmentRole",
    "Side",
    "SplitMode",
    "StartFrom",
    "get_mode",
    "load_extra_modes",
    "mode_names",
    "mode_paths",
    "register",
    "require_mode",
]
