"""A job's description: what it trains and how, in one versioned, checked form.

:class:`JobDescription` is the job's contract. The coordinator builds it from a new job's
request, stores it (``Job.description``) and serves it (the job's detail, the agent's
assignment); the worker and the agent read it back with :meth:`JobDescription.from_json`
and build their model and :class:`~medsplit.training.config.TrainingConfig` from it. Its
rules (the mode and its cuts, the options, the optimizers, the codec, the ranges) are
checked here and nowhere else; the coordinator adds only what needs its database (the
participants, their data, the cut table).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from medsplit.defenses import PrivacyOptions, privacy_problems
from medsplit.errors import ConfigError, UnknownModeError, UnknownModelError
from medsplit.models import get_model_spec, is_factory_name, model_names
from medsplit.models.factory import canonical_model_args, factory_module
from medsplit.modes import DEFAULT_MODE, Side, SplitMode, get_mode
from medsplit.protocol.optim import OptimizerConfig
from medsplit.training.augment import Augmentation, augmentation_json, augmentation_problems
from medsplit.training.config import VERTICAL_AUGMENTATION, TrainingConfig
from medsplit.training.party_models import (
    PartyFront,
    PartyModelSpec,
    party_models_from_json,
    party_models_problems,
)
from medsplit.training.setup import JobModel
from medsplit.training.tasks import DEFAULT_TASK, TASKS, get_task, loss_name
from medsplit.training.tasks import label_shape as tasks_label_shape
from medsplit.wire.codecs import CODECS

#: The version of the JSON form this code writes and reads. A party refuses any other
#: one rather than guess at it; a change of meaning, a field added or one taken away
#: bumps it (and the coordinator's migration carries stored jobs over).
FORMAT = 4
#: The versions this code reads, each carried over to :data:`FORMAT` as it is read: 1 is
#: 2 without ``model_args`` (none: the registry models of its day take none); 2 is 3
#: without the fields :data:`_NEW_IN_3` (each at its default: ``party_models`` none, so
#: every vertical party ran the job's model; the task classification; no augmentation);
#: 3 is 4 without ``privacy`` (no measurement, no defense).
READS = (1, 2, 3, FORMAT)

#: The largest seed (it seeds torch's generators and fits PostgreSQL's integer).
MAX_SEED = 2**31 - 1


class JobDescriptionError(ConfigError):
    """A job description that cannot be used.

    Attributes:
        problems: each wrong field's reasons, by the field's name in the JSON form.
    """

    def __init__(self, problems: Mapping[str, list[str]]) -> None:
        self.problems = {name: list(reasons) for name, reasons in problems.items()}
        listed = "; ".join(f"{name}: {' / '.join(r)}" for name, r in self.problems.items())
        super().__init__(f"the job description is not valid: {listed}")


@dataclass(frozen=True)
class JobDescription:
    """What a job trains and how.

    Attributes:
        model: a registry model's name (:mod:`medsplit.models`), or ``MODULE:FACTORY``
            (:mod:`medsplit.models.factory`; each party builds it only when it lists the
            module).
        model_args: a ``MODULE:FACTORY`` model's keyword arguments, a JSON object of at
            most :data:`~medsplit.models.factory.MAX_ARGS_BYTES`; none for a registry one.
        spatial_dims: 2 or 3.
        in_channels: channels of an input.
        num_classes: classes the model tells apart, at least 2.
        input_shape: one input's (C, H, W[, D]), C being ``in_channels``; a table model's
            (``tabular_mlp``) is ``(F,)``, its ``F`` columns being ``in_channels`` (its
            ``spatial_dims`` is then 2, unused: a table has no sides).
        cuts: submodule names to cut after, as many as the mode cuts.
        mode: a registered mode's name (:mod:`medsplit.modes`).
        mode_options: the mode's own settings (:meth:`SplitMode.options`), every one
            present: those left out take their defaults.
        client_optimizer: what trains the hospitals' segments.
        server_optimizer: what trains the server's segment.
        batch_size: samples per step.
        local_epochs: passes over a hospital's data in one turn.
        max_steps_per_turn: stop a turn after this many steps (``None``: no cap).
        rounds: how many times every hospital takes a turn.
        codec: the wire codec (:data:`medsplit.wire.codecs.CODECS`; ``none`` is exact).
        seed: seeds the model's weights and every batch order.
        party_models: in a vertical job, the parties (by hospital) that run a model of
            their own rather than the job's (:mod:`medsplit.training.party_models`); the
            label party, the first participant, always runs the job's model.
        task: what the job learns (:data:`medsplit.training.tasks.TASKS`); a
            segmentation job needs a segmentation model (``ModelSpec.tasks``).
        loss: one of the task's losses; ``""`` for its default.
        augmentation: MONAI random transforms on every training batch, drawn per step
            from the seed (:mod:`medsplit.training.augment`): a list of
            ``{"name": NAME, PARAM: VALUE}``, parameters filled in; empty: none.
        privacy: what each hospital measures of its exposure and which defenses it
            applies (:mod:`medsplit.defenses.options`); all off by default, and any
            defense on makes the job inexact against unsplit training.
        version: the JSON form's version, :data:`FORMAT`.

    Raises:
        JobDescriptionError: every wrong field, with its reasons.
    """

    model: str
    spatial_dims: int
    in_channels: int
    num_classes: int
    input_shape: tuple[int, ...]
    cuts: tuple[str, ...]
    model_args: Mapping[str, Any] = field(default_factory=dict)
    mode: str = DEFAULT_MODE
    mode_options: Mapping[str, Any] = field(default_factory=dict)
    client_optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    server_optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    batch_size: int = 32
    local_epochs: int = 1
    max_steps_per_turn: int | None = None
    rounds: int = 1
    codec: str = "none"
    seed: int = 0
    party_models: Mapping[str, PartyModelSpec] = field(default_factory=dict)
    task: str = DEFAULT_TASK
    loss: str = ""
    augmentation: Augmentation = ()
    privacy: PrivacyOptions = field(default_factory=PrivacyOptions)
    version: int = FORMAT

    def __post_init__(self) -> None:
        values = {name: getattr(self, name) for name in _FIELDS}
        problems: dict[str, list[str]] = {}
        normal = _check(values, problems, partial=False)
        if problems:
            raise JobDescriptionError(problems)
        for name, value in normal.items():
            object.__setattr__(self, name, value)

    # -- the JSON form ---------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The JSON form: every field, tuples as lists; :meth:`from_json` reads it back."""
        return {
            "version": self.version,
            "model": self.model,
            "model_args": dict(self.model_args),
            "spatial_dims": self.spatial_dims,
            "in_channels": self.in_channels,
            "num_classes": self.num_classes,
            "input_shape": list(self.input_shape),
            "mode": self.mode,
            "mode_options": dict(self.mode_options),
            "cuts": list(self.cuts),
            "client_optimizer": self.client_optimizer.to_json(),
            "server_optimizer": self.server_optimizer.to_json(),
            "batch_size": self.batch_size,
            "local_epochs": self.local_epochs,
            "max_steps_per_turn": self.max_steps_per_turn,
            "rounds": self.rounds,
            "codec": self.codec,
            "seed": self.seed,
            "party_models": {name: spec.to_json() for name, spec in self.party_models.items()},
            "task": self.task,
            "loss": self.loss,
            "augmentation": augmentation_json(self.augmentation),
            "privacy": self.privacy.to_json(),
        }

    @classmethod
    def from_json(cls, data: object) -> JobDescription:
        """A description from its JSON form, strictly: ``version`` and the model's fields
        and ``cuts`` are required, the others default; no other key is accepted. A version
        of :data:`READS` older than :data:`FORMAT` is read as this one.

        Raises:
            JobDescriptionError: another version (nothing else is looked at then), an
                unknown or missing field, a value of the wrong type or out of range;
                every problem, by field.
        """
        problems = cls.problems(data)
        if problems:
            raise JobDescriptionError(problems)
        assert isinstance(data, Mapping)
        values = _parse(data, {})
        values["version"] = FORMAT
        return cls(**values)

    @classmethod
    def problems(cls, data: object, *, partial: bool = False) -> dict[str, list[str]]:
        """Every problem of ``data`` as the JSON form, by field; empty when it is valid.

        ``partial``: the fields left out are not problems, and the rules that need them
        are skipped (the coordinator checks what it has before it knows every field).
        """
        if not isinstance(data, Mapping):
            return {"non_field_errors": [f"a job description is a JSON object, not {data!r}"]}
        problems: dict[str, list[str]] = {}
        version = data.get("version", FORMAT if partial else None)
        if not _is_int(version) or version not in READS:  # 1.0 and True equal 1, are not it
            if "version" not in data:
                reason = f"required: the JSON form's version ({FORMAT} here)"
            else:
                reads = ", ".join(map(str, READS))
                reason = (
                    f"version {version!r} is not one this party reads (it reads {reads}); "
                    "update the older of the two parties"
                )
            return {"version": [reason]}
        known = _KNOWN[version]
        for key in data:
            if key not in known:
                _add(problems, str(key), f"unknown field; known fields: {', '.join(known)}")
        if not partial:
            for name in _REQUIRED:
                if name not in data:
                    _add(problems, name, "required")
        values = _parse(data, problems)
        values.pop("version", None)  # one of READS, read as FORMAT
        _check(values, problems, partial=partial)
        return problems

    # -- what the parties build from it ----------------------------------------------

    @property
    def split_mode(self) -> SplitMode:
        """The job's mode, from the registry, bound to the job's options."""
        return get_mode(self.mode).with_options(self.mode_options)

    def job_model(self) -> JobModel:
        """The job's model as every party builds it (from the job's seed)."""
        return JobModel(
            name=self.model,
            spatial_dims=self.spatial_dims,
            in_channels=self.in_channels,
            num_classes=self.num_classes,
            input_shape=self.input_shape,
            seed=self.seed,
            model_args=canonical_model_args(self.model_args) if self.model_args else "",
        )

    def party_fronts(self) -> tuple[PartyFront, ...]:
        """The parties with a model of their own, as every side builds their fronts."""
        return tuple(
            PartyFront(
                name,
                spec.job_model(num_classes=self.num_classes, seed=self.seed),
                spec.cut,
            )
            for name, spec in self.party_models.items()
        )

    def training_config(self, job: str) -> TrainingConfig:
        """The training settings of the job called ``job`` (the id every frame carries)."""
        return TrainingConfig(
            cuts=self.cuts,
            mode=self.mode,
            mode_options=self.mode_options,
            client_optimizer=self.client_optimizer,
            server_optimizer=self.server_optimizer,
            batch_size=self.batch_size,
            local_epochs=self.local_epochs,
            max_steps_per_turn=self.max_steps_per_turn,
            rounds=self.rounds,
            codec=self.codec,
            seed=self.seed,
            job=job,
            task=self.task,
            loss=self.loss,
            augmentation=self.augmentation,
            privacy=self.privacy,
        )

    @property
    def label_shape(self) -> tuple[int, ...]:
        """One sample's training target: ``()`` a class index, ``(1, *spatial)`` a mask."""
        return tasks_label_shape(self.task, self.input_shape)


# -- the rules, in one place ---------------------------------------------------------

_FIELDS = (
    "version",
    "model",
    "model_args",
    "spatial_dims",
    "in_channels",
    "num_classes",
    "input_shape",
    "mode",
    "mode_options",
    "cuts",
    "client_optimizer",
    "server_optimizer",
    "batch_size",
    "local_epochs",
    "max_steps_per_turn",
    "rounds",
    "codec",
    "seed",
    "party_models",
    "task",
    "loss",
    "augmentation",
    "privacy",
)
#: The fields version 4 added (version 3 is read with them at their defaults).
_NEW_IN_4 = ("privacy",)
#: The fields of version 3.
_FIELDS_3 = tuple(name for name in _FIELDS if name not in _NEW_IN_4)
#: The fields version 3 added (version 2 is read with them at their defaults).
_NEW_IN_3 = ("party_models", "task", "loss", "augmentation")
#: The fields of version 2.
_FIELDS_2 = tuple(name for name in _FIELDS_3 if name not in _NEW_IN_3)
#: The fields of version 1.
_FIELDS_1 = tuple(name for name in _FIELDS_2 if name != "model_args")
#: The fields each version read takes.
_KNOWN = {1: _FIELDS_1, 2: _FIELDS_2, 3: _FIELDS_3, FORMAT: _FIELDS}
_REQUIRED = ("model", "spatial_dims", "in_channels", "num_classes", "input_shape", "cuts")
#: The integer fields and their least value.
_AT_LEAST = {
    "spatial_dims": 2,
    "in_channels": 1,
    "num_classes": 2,
    "batch_size": 1,
    "local_epochs": 1,
    "rounds": 1,
    "seed": 0,
}


def _add(problems: dict[str, list[str]], name: str, reason: str) -> None:
    problems.setdefault(name, []).append(reason)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse(data: Mapping[str, Any], problems: dict[str, list[str]]) -> dict[str, Any]:
    """The JSON values that have the right type, as the dataclass takes them; the others
    are left out, with a problem each."""
    values: dict[str, Any] = {}
    for name in _FIELDS:
        if name not in data:
            continue
        value = data[name]
        if name in ("model", "mode", "codec", "task", "loss"):
            ok = isinstance(value, str)
        elif name in _AT_LEAST or name == "version":
            ok = _is_int(value)
        elif name == "max_steps_per_turn":
            ok = value is None or _is_int(value)
        elif name == "input_shape":
            ok = isinstance(value, list | tuple) and all(_is_int(d) for d in value)
            value = tuple(value) if ok else value
        elif name == "cuts":
            ok = isinstance(value, list | tuple) and all(isinstance(c, str) for c in value)
            value = tuple(value) if ok else value
        elif name in ("mode_options", "model_args", "party_models"):
            ok = isinstance(value, Mapping) and all(isinstance(k, str) for k in value)
        elif name == "augmentation":
            ok = isinstance(value, list | tuple)  # its items: _check_augmentation
        elif name == "privacy":
            ok = isinstance(value, Mapping | PrivacyOptions)  # its parts: _check_privacy
        else:  # the optimizers
            try:
                value = OptimizerConfig.from_json(value)
                ok = True
            except ConfigError as e:
                _add(problems, name, str(e))
                continue
        if ok:
            values[name] = value
        else:
            _add(problems, name, f"has the wrong type: {value!r}")
    return values


def _check(
    values: dict[str, Any], problems: dict[str, list[str]], *, partial: bool
) -> dict[str, Any]:
    """Check the typed ``values`` (the constructor's, or those :func:`_parse` kept), adding
    a problem for each rule broken; return the values normalised (tuples, a read-only
    mapping, the mode's options with their defaults). ``partial``: skip what is absent."""
    normal: dict[str, Any] = {}

    def present(name: str) -> bool:
        return name in values and name not in problems

    if present("version") and values["version"] != FORMAT:
        _add(problems, "version", f"version {values['version']!r} is not {FORMAT}")
    for name, least in _AT_LEAST.items():
        if present(name):
            value = values[name]
            if not _is_int(value) or value < least:
                _add(problems, name, f"must be an integer >= {least}, got {value!r}")
    if present("spatial_dims") and values["spatial_dims"] > 3:
        _add(problems, "spatial_dims", f"must be 2 or 3, got {values['spatial_dims']}")
    if present("seed") and values["seed"] > MAX_SEED:
        _add(problems, "seed", f"must be at most {MAX_SEED}, got {values['seed']}")
    if present("max_steps_per_turn"):
        steps = values["max_steps_per_turn"]
        if steps is not None and (not _is_int(steps) or steps < 1):
            _add(problems, "max_steps_per_turn", f"must be >= 1 or null, got {steps!r}")
    if present("model"):
        try:
            if is_factory_name(values["model"]):
                factory_module(values["model"])  # the form only: each party has its list
                normal["model"] = values["model"]
            else:
                normal["model"] = get_model_spec(values["model"]).name
        except UnknownModelError as e:
            _add(problems, "model", str(e))
    _check_model_args(values, problems, normal, present)
    _check_task(values, problems, normal, present)
    if present("codec") and values["codec"] not in CODECS:
        _add(
            problems,
            "codec",
            f"unknown codec {values['codec']!r}; known codecs: {', '.join(CODECS)}",
        )
    for side in ("client_optimizer", "server_optimizer"):
        if present(side) and not isinstance(values[side], OptimizerConfig):
            _add(problems, side, f"must be an OptimizerConfig, got {values[side]!r}")
    _check_shape(values, problems, normal, present)
    mode = _check_mode(values, problems, normal, present, partial)
    _check_party_models(mode, values, problems, normal, present)
    if mode is not None:
        _check_options(mode, values, problems, normal, present, partial)
        if "mode_options" in normal and "mode_options" not in problems:
            # The options may change the mode's cuts (SplitFed's label placement).
            mode = mode.with_options(normal["mode_options"])
        _check_cuts(mode, values, problems, normal, present)
    _check_augmentation(mode, values, problems, normal, present)
    _check_privacy(mode, values, problems, normal, present)
    return normal


def _check_model_args(values, problems, normal, present) -> None:
    """A factory's arguments: a bounded JSON object, for a ``MODULE:FACTORY`` model only."""
    if not present("model_args"):
        return
    try:
        text = canonical_model_args(values["model_args"])
    except ConfigError as e:
        _add(problems, "model_args", str(e))
        return
    model = values.get("model")
    registry = isinstance(model, str) and "model" not in problems and not is_factory_name(model)
    if text != "{}" and registry:
        _add(
            problems,
            "model_args",
            f"{model} is a registry model: it takes no model_args (they are the keyword "
            "arguments of a MODULE:FACTORY model)",
        )
        return
    normal["model_args"] = MappingProxyType(json.loads(text))  # a copy no caller holds


def _check_party_models(mode: SplitMode | None, values, problems, normal, present) -> None:
    """Own models only in a mode whose parties hold different features, each entry valid
    (the coordinator checks the names against the participants and the cuts)."""
    if not present("party_models"):
        return
    given = values["party_models"]
    if not given:
        normal["party_models"] = MappingProxyType({})
        return
    if mode is not None and not mode.feature_sets:
        _add(
            problems,
            "party_models",
            f"only a mode whose parties hold different features of the same patients runs "
            f"a model per party; {mode.name} mode runs the job's model at every hospital",
        )
        return
    reasons = party_models_problems(
        {k: v.to_json() if isinstance(v, PartyModelSpec) else v for k, v in given.items()}
    )
    for reason in reasons:
        _add(problems, "party_models", reason)
    if not reasons:
        normal["party_models"] = party_models_from_json(given)


def _table_model(values, problems) -> bool:
    """Whether the job's model is a registry model of table rows (its input ``(F,)``)."""
    model = values.get("model")
    if not isinstance(model, str) or "model" in problems or is_factory_name(model):
        return False
    try:
        return len(get_model_spec(model).default_input_shape) == 1
    except UnknownModelError:
        return False


def _check_task(values, problems, normal, present) -> None:
    """The task, its loss, and that a registry model does that task (a factory model's
    output is checked where it is built: :func:`~medsplit.training.tasks.check_model_output`)."""
    task = values.get("task", DEFAULT_TASK)
    if "task" in problems:
        return
    if not isinstance(task, str) or task not in TASKS:
        _add(problems, "task", f"unknown task {task!r}; known tasks: {', '.join(TASKS)}")
        return
    if present("loss"):
        try:
            loss_name(task, values["loss"])
        except ConfigError as e:
            _add(problems, "loss", str(e))
    mode = values.get("mode", DEFAULT_MODE)
    if task != DEFAULT_TASK and isinstance(mode, str) and "mode" not in problems:
        try:
            if get_mode(mode).feature_sets:
                _add(problems, "task", f"{mode} mode trains classification only, not {task}")
        except UnknownModeError:
            pass  # the mode's own check says so
    model = normal.get("model")
    if model is not None and not is_factory_name(model):
        spec = get_model_spec(model)
        if task not in spec.tasks:
            fits = ", ".join(m for m in model_names() if task in get_model_spec(m).tasks)
            _add(
                problems,
                "model",
                f"{model} is a {' / '.join(spec.tasks)} model; a {get_task(task).name} job "
                f"needs one of: {fits or 'none registered'}",
            )


def _check_shape(values, problems, normal, present) -> None:
    if not present("input_shape"):
        return
    shape = tuple(values["input_shape"])
    if not all(_is_int(d) and d >= 1 for d in shape):
        _add(problems, "input_shape", f"must be positive integers, got {list(shape)}")
        return
    normal["input_shape"] = shape
    if _table_model(values, problems):
        if len(shape) != 1:
            _add(
                problems,
                "input_shape",
                f"{values['model']} takes a table's rows: its input_shape is (columns,), "
                f"got {list(shape)}",
            )
        elif present("in_channels") and shape[0] != values["in_channels"]:
            _add(
                problems,
                "input_shape",
                f"{list(shape)} has {shape[0]} columns, not in_channels {values['in_channels']}",
            )
        return
    if present("spatial_dims") and len(shape) != values["spatial_dims"] + 1:
        _add(
            problems,
            "input_shape",
            f"{list(shape)} has {len(shape)} values; spatial_dims {values['spatial_dims']} "
            f"takes channels and {values['spatial_dims']} sides",
        )
    elif present("in_channels") and shape[0] != values["in_channels"]:
        _add(
            problems,
            "input_shape",
            f"{list(shape)} has {shape[0]} channel(s), not in_channels {values['in_channels']}",
        )


def _check_mode(values, problems, normal, present, partial) -> SplitMode | None:
    """The mode, once it is registered (its cuts are checked once its options are)."""
    if not present("mode"):
        if partial:
            return None
        values = {**values, "mode": DEFAULT_MODE}
    try:
        mode = get_mode(values["mode"])  # the message lists the known ones
    except UnknownModeError as e:
        _add(problems, "mode", str(e))
        return None
    return mode


def _check_cuts(mode: SplitMode, values, problems, normal, present) -> None:
    """The cuts, checked by the mode (bound to the job's options) itself."""
    if present("cuts"):
        cuts = values["cuts"]
        if isinstance(cuts, str) or not all(isinstance(c, str) and c for c in cuts):
            _add(problems, "cuts", f"must be a list of submodule names, got {cuts!r}")
        else:
            try:
                normal["cuts"] = mode.check_cuts(cuts)
            except ConfigError as e:
                _add(problems, "cuts", str(e))


def _check_options(mode: SplitMode, values, problems, normal, present, partial) -> None:
    """The mode's options: only those it takes, each of its type; defaults filled in."""
    if not present("mode_options"):
        if partial:
            return
        values = {**values, "mode_options": {}}
    given = values["mode_options"]
    if not isinstance(given, Mapping):
        _add(problems, "mode_options", f"must be an object, got {given!r}")
        return
    options = {o.name: o for o in mode.options()}
    filled: dict[str, Any] = {}
    for key in given:
        if key not in options:
            takes = ", ".join(options) or "none"
            _add(
                problems,
                "mode_options",
                f"{mode.name} mode has no option {key!r} (it takes {takes})",
            )
    for name, option in options.items():
        value = given.get(name, option.default)
        problem = option.problem(value)  # its type, and its choices if it has any
        if problem is not None:
            _add(problems, "mode_options", problem)
        filled[name] = value
    normal["mode_options"] = MappingProxyType(filled)


def _check_augmentation(mode: SplitMode | None, values, problems, normal, present) -> None:
    """The transforms: known, their parameters in range, fit for the images' shape; none
    in a mode whose parties hold different features of a record."""
    if not present("augmentation"):
        return
    shape = values.get("input_shape") if present("input_shape") else None
    augmentation, reasons = augmentation_problems(values["augmentation"], input_shape=shape)
    for reason in reasons:
        _add(problems, "augmentation", reason)
    if augmentation and mode is not None and mode.feature_sets:
        _add(problems, "augmentation", VERTICAL_AUGMENTATION)
    if not reasons:
        normal["augmentation"] = augmentation


def _check_privacy(mode: SplitMode | None, values, problems, normal, present) -> None:
    """The privacy options: known parts and settings in range, each defense where the
    mode's labels make it mean something."""
    if not present("privacy"):
        return
    given = values["privacy"]
    if isinstance(given, PrivacyOptions):
        given = given.to_json()
    labels_at_server = None if mode is None else mode.labels == Side.SERVER
    feature_sets = mode is not None and mode.feature_sets
    options, reasons = privacy_problems(
        given,
        labels_at_server=labels_at_server,
        feature_sets=feature_sets,
        label_probes=None if mode is None else mode.label_probes,
    )
    for reason in reasons:
        _add(problems, "privacy", reason)
    if options is not None:
        normal["privacy"] = options
