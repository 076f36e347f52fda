"""The modes MedSplit knows, by name: the built-in ones and those a party's own
configuration adds (:func:`load_extra_modes`, for a ``MEDSPLIT_EXTRA_MODES`` setting)."""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from medsplit.errors import ConfigError, ModeLoadError, UnknownModeError
from medsplit.modes.base import Side, SplitMode
from medsplit.modes.splitfed import SplitFedMode
from medsplit.modes.ushaped import UShapedMode
from medsplit.modes.vanilla import VanillaMode
from medsplit.modes.vertical import VerticalMode
from medsplit.wire.frame import MODE_NAME_RE

#: Every registered mode by name, in registration order (the built-in ones first).
MODES: dict[str, SplitMode] = {}

#: The mode of a job that does not say.
DEFAULT_MODE = VanillaMode.name
#: The mode a job defaults to where its labels should stay at the hospital (a segmentation
#: job's masks: the demo's default for one).
DEFAULT_LABELS_HOME_MODE = UShapedMode.name


def register(mode: SplitMode) -> SplitMode:
    """Add ``mode`` to :data:`MODES` once it describes itself consistently.

    Registering another instance of a class already registered under the name does
    nothing (loading the same configuration twice is harmless).

    Raises:
        ConfigError: not a :class:`SplitMode`, an unusable name, cuts, labels or segment
            layout, or the name taken by another class.
    """
    if not isinstance(mode, SplitMode):
        raise ConfigError(f"a mode must be a SplitMode instance, got {mode!r}")
    _check(mode)
    known = MODES.get(mode.name)
    if known is not None:
        if type(known) is type(mode):
            return known
        raise ConfigError(
            f"mode name {mode.name!r} is already taken by {_where(type(known))}; "
            f"{_where(type(mode))} needs another name"
        )
    MODES[mode.name] = mode
    return mode


def get_mode(name: str) -> SplitMode:
    """The registered mode called ``name``.

    Raises:
        UnknownModeError: no such mode; the message lists the known ones.
    """
    mode = MODES.get(name) if isinstance(name, str) else None
    if mode is None:
        raise UnknownModeError(f"unknown mode {name!r}; known modes: {', '.join(MODES)}")
    return mode


def mode_names(*, platform: bool = False) -> list[str]:
    """The registered modes' names, in registration order; with ``platform``, only those
    the platform runs (:attr:`SplitMode.runs_on_platform`)."""
    return [name for name, mode in MODES.items() if mode.runs_on_platform or not platform]


def mode_paths(text: str | None) -> list[str]:
    """The ``"module:Class"`` paths of a comma-separated setting (empty items left out)."""
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def require_mode(name: str, *, setting: str) -> SplitMode:
    """The registered mode called ``name``, for a party about to run a job in it.

    Raises:
        UnknownModeError: no such mode here; the message names the mode, the known ones
            and ``setting``, the party's own configuration that would add it (a party
            runs only the code it was configured with).
    """
    try:
        return get_mode(name)
    except UnknownModeError as e:
        raise UnknownModeError(
            f"{e}. This party runs only the modes it was configured with: to run "
            f'{name!r} jobs here, name its class in {setting} ("package.module:ClassName")'
        ) from None


def load_extra_modes(paths: Iterable[str]) -> list[SplitMode]:
    """Import and register the modes named by ``paths``, each ``"package.module:Name"``
    or ``"package.module.Name"``, naming a :class:`SplitMode` subclass (instantiated
    with no arguments) or instance.

    Returns:
        The registered modes, in the order given.

    Raises:
        ModeLoadError: a path that cannot be imported or names no mode.
        ConfigError: a mode that does not describe itself consistently, or whose name
            is taken (see :func:`register`).
    """
    return [register(_load(path)) for path in paths]


def _load(path: str) -> SplitMode:
    path = path.strip()
    module_name, sep, attribute = path.partition(":")
    if not sep:
        module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute:
        raise ModeLoadError(
            f"extra mode {path!r} is not 'package.module:ClassName' or 'package.module.ClassName'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ModeLoadError(f"extra mode {path!r}: cannot import {module_name!r}: {e}") from e
    try:
        target = getattr(module, attribute)
    except AttributeError:
        raise ModeLoadError(f"extra mode {path!r}: {module_name!r} has no {attribute!r}") from None
    if isinstance(target, type) and issubclass(target, SplitMode):
        try:
            target = target()
        except TypeError as e:  # abstract hooks left out, or arguments required
            raise ModeLoadError(f"extra mode {path!r} cannot be made: {e}") from e
    if not isinstance(target, SplitMode):
        raise ModeLoadError(
            f"extra mode {path!r} is a {type(target).__name__}, not a SplitMode subclass "
            "or instance"
        )
    return target


def _check(mode: SplitMode) -> None:
    """The class attributes and the segment layout a mode must get right."""
    where = _where(type(mode))
    missing = [
        a for a in ("name", "title", "summary", "cuts", "labels") if not hasattr(type(mode), a)
    ]
    if missing:
        raise ConfigError(f"mode {where} does not set {', '.join(missing)}")
    if not isinstance(mode.name, str) or MODE_NAME_RE.fullmatch(mode.name) is None:
        raise ConfigError(
            f"mode {where}: name must be 1 to 16 characters of [a-z0-9_] starting with a "
            f"letter, got {mode.name!r}"
        )
    if not isinstance(mode.cuts, int) or isinstance(mode.cuts, bool) or mode.cuts < 1:
        raise ConfigError(f"mode {mode.name!r}: cuts must be an integer >= 1, got {mode.cuts!r}")
    if not isinstance(mode.labels, Side):
        raise ConfigError(f"mode {mode.name!r}: labels must be a Side, got {mode.labels!r}")
    segments = mode.client_segments()
    indices = [*segments.values(), mode.server_segment]
    if sorted(indices) != list(range(mode.cuts + 1)):
        raise ConfigError(
            f"mode {mode.name!r}: its {mode.cuts} cut(s) make segments 0..{mode.cuts}, and "
            f"each must be held once; hospitals hold {segments}, the server "
            f"{mode.server_segment}"
        )


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


register(VanillaMode())
register(UShapedMode())
register(SplitFedMode())
register(VerticalMode())
