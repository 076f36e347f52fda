"""Checking a job's configuration against the registry, the cut table and the hospitals.

:func:`job_spec_validate` checks everything a job names, server-side, and raises one
:class:`~kernel.errors.InvalidInput` whose ``details`` map each wrong field to all
of its reasons, so a form can show every problem at once. Syntax (types, ranges, unknown
fields) is checked by a DRF serializer; the job description's rules (the model exists,
the mode and its number of cuts, the optimizers, the codec...) by medsplit's
:class:`~medsplit.training.description.JobDescription`, in one place; what needs the
database (the participants, their data, the cuts against the cut table at their shape)
here.

Building a model and tracing it costs seconds (DenseNet121: about 2 s at 1x64x64, 3.5 s
at 1x512x512, 25 s and +0.8 GB at 1x1448x1448), so the results are cached per (model,
parameters, input shape, cuts) with small LRU caches, and the cut table any signed-in
person may ask for (:func:`model_cut_table`) is bounded in size
(:data:`CUT_TABLE_MAX_SIDE`, :data:`CUT_TABLE_MAX_VALUES`) and cached in the cache every
process shares.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import threading
from collections.abc import Mapping
from dataclasses import MISSING, dataclass
from functools import lru_cache
from typing import Any

import torch
from django.core.cache import cache
from rest_framework import serializers
from rest_framework.fields import SkipField
from torch import nn

from hospitals.models import Hospital
from kernel.errors import InvalidInput, NotFound, TooManyRequests
from medsplit.cutting.candidates import MAX_DEPTH
from medsplit.cutting.split import split_model
from medsplit.cutting.table import CutInfo, cut_table
from medsplit.errors import ConfigError, CutError, UnknownModelError
from medsplit.models import (
    is_factory_name,
    model_modules,
    parse_model_args,
    require_model_module,
)
from medsplit.models.factory import (
    MAX_ARGS_BYTES,
    MAX_NAME_CHARS,
    build_factory_model,
    canonical_model_args,
    factory_module,
    module_allowed,
)
from medsplit.models.registry import build_model, get_model_spec
from medsplit.modes import MODES, SplitMode
from medsplit.training.description import FORMAT, MAX_SEED, JobDescription
from medsplit.training.party_models import MAX_INPUT_VALUES  # one sample's largest input
from medsplit.training.tasks import DEFAULT_TASK, SEGMENTATION, TASKS, check_model_output
from medsplit.training.vertical_parts import job_vertical_model
from training.apps import MODEL_MODULES_SETTING
from training.models import OnFailure

#: Most parameters a ``MODULE:FACTORY`` model may have for the coordinator to build it
#: (1 GiB of float32; the largest registry model, DenseNet121, has 7 million).
MAX_FACTORY_PARAMETERS = 2**28
MAX_PARTICIPANTS = 64

#: Bounds of the input shapes ``GET /api/models/{name}/cuts/`` traces a model at: any
#: signed-in person may ask, and the cost grows with the shape. The cuts are the same at
#: every size (only the crossing shapes scale), so these leave room for real images
#: (3x224x224, 1x512x512, 1x64x64x64) and refuse what costs tens of seconds.
CUT_TABLE_MAX_SIDE = 512
CUT_TABLE_MAX_VALUES = 2**18
CUT_TABLE_MAX_CHANNELS = 64
#: How long a cut table stays in the shared cache; a new model version means a new key.
CUT_TABLE_CACHE_SECONDS = 24 * 3600
#: How long a request waits for another cut table being worked out in its process.
CUT_TABLE_WAIT_SECONDS = 10.0


class InputTooLarge(InvalidInput):
    """An input shape beyond what the cut table is worked out for; the message names the
    limit that was passed."""

    code = "input_too_large"


#: The job description's defaults, which the request's optional fields take.
_DEFAULT = {
    f.name: f.default for f in dataclasses.fields(JobDescription) if f.default is not MISSING
}


class ParticipantInput(serializers.Serializer):
    hospital = serializers.SlugField(max_length=64, help_text="the hospital's slug")
    feature_set = serializers.CharField(
        max_length=64,
        required=False,
        allow_blank=True,
        default="",
        help_text="only in modes whose hospitals hold different features of the same "
        "patients (see GET /api/modes/): which features this hospital holds",
    )


class JobInput(serializers.Serializer):
    """What ``POST /api/jobs/`` takes. Optional parameters default as shown."""

    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    model = serializers.CharField(
        max_length=MAX_NAME_CHARS,
        help_text="a name from GET /api/models/, or MODULE:FACTORY for a factory in a module "
        "the coordinator lists in MEDSPLIT_MODEL_MODULES (and every participant's agent in "
        "its model_modules), with model_args",
    )
    model_args = serializers.DictField(
        required=False,
        default=dict,
        help_text="a MODULE:FACTORY model's keyword arguments, a JSON object of at most "
        f"{MAX_ARGS_BYTES} bytes; none for a registry model",
    )
    spatial_dims = serializers.IntegerField(
        min_value=2,
        max_value=3,
        required=False,
        allow_null=True,
        default=None,
        help_text="default: from the participants' image shape",
    )
    in_channels = serializers.IntegerField(
        min_value=1,
        max_value=64,
        required=False,
        allow_null=True,
        default=None,
        help_text="default: from the participants' image shape",
    )
    num_classes = serializers.IntegerField(
        min_value=2,
        max_value=10_000,
        help_text="classes of a label (classification) or of a mask's pixels, the "
        "background with them (segmentation)",
    )
    task = serializers.ChoiceField(
        choices=list(TASKS),
        required=False,
        default=DEFAULT_TASK,
        help_text="what the job learns (see GET /api/tasks/): classification or "
        "segmentation; every participant's data must hold its targets (labels, masks)",
    )
    loss = serializers.CharField(
        max_length=64,
        required=False,
        allow_blank=True,
        default="",
        help_text="one of the task's losses (GET /api/tasks/); empty: the task's default",
    )
    mode = serializers.CharField(
        max_length=16,
        required=False,
        default=_DEFAULT["mode"],
        help_text="a mode's name (see GET /api/modes/)",
    )
    cuts = serializers.ListField(
        child=serializers.CharField(max_length=200),
        min_length=1,
        max_length=8,
        help_text="as many as the mode's cuts (GET /api/modes/), among those of "
        "GET /api/models/{name}/cuts/",
    )
    client_optimizer = serializers.DictField(
        required=False,
        default=dict,
        help_text="see GET /api/optimizers/; options left out take their defaults",
    )
    server_optimizer = serializers.DictField(
        required=False, default=dict, help_text="see GET /api/optimizers/"
    )
    batch_size = serializers.IntegerField(
        min_value=1, max_value=4096, required=False, default=_DEFAULT["batch_size"]
    )
    local_epochs = serializers.IntegerField(
        min_value=1, max_value=100, required=False, default=_DEFAULT["local_epochs"]
    )
    max_steps_per_turn = serializers.IntegerField(
        min_value=1,
        max_value=1_000_000,
        required=False,
        allow_null=True,
        default=_DEFAULT["max_steps_per_turn"],
    )
    rounds = serializers.IntegerField(
        min_value=1, max_value=1000, required=False, default=_DEFAULT["rounds"]
    )
    mode_options = serializers.DictField(
        required=False,
        default=dict,
        help_text="the mode's own settings by name (GET /api/modes/ lists each mode's "
        "options, their choices and defaults); those left out take their defaults",
    )
    codec = serializers.CharField(
        max_length=16,
        required=False,
        default=_DEFAULT["codec"],
        help_text="a codec's name (see GET /api/codecs/)",
    )
    seed = serializers.IntegerField(
        min_value=0, max_value=MAX_SEED, required=False, default=_DEFAULT["seed"]
    )
    augmentation = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        default=list,
        help_text="MONAI random transforms on every training batch, drawn per step from the "
        'seed: a list of {"name": NAME, PARAM: VALUE} (see GET /api/augmentations/); '
        "parameters left out take their defaults; none by default",
    )
    on_failure = serializers.ChoiceField(
        choices=OnFailure.choices, required=False, default=OnFailure.RETRY
    )
    max_retries = serializers.IntegerField(min_value=0, max_value=10, required=False, default=2)
    round_deadline_seconds = serializers.IntegerField(
        min_value=10,
        max_value=7 * 86400,
        required=False,
        default=3600,
        help_text="a parallel round's (SplitFed's) limit, from its start, and then its "
        "secure aggregation's: a hospital still training or not yet submitted by then is "
        "left to on_failure (skip: the round goes on without it)",
    )
    privacy = serializers.DictField(
        required=False,
        default=dict,
        help_text="what each hospital measures of its own exposure and which defenses it "
        'applies, each part off unless given, e.g. {"audit": {"every_rounds": 1, '
        '"decoder_steps": 300, "records": 1024}, "activation_noise": {"clip_norm": 1.0, '
        '"target_epsilon": 8.0, "delta": 1e-5}, "nopeek": {"weight": 0.1}, "label_noise": '
        '{"epsilon": 2.0}, "gradient_noise": {"scale": 0.5}, "hijack_detection": '
        '{"method": "splitout"}} (medsplit/defenses/options.py); none by default',
    )
    participants = ParticipantInput(many=True, allow_empty=False, max_length=MAX_PARTICIPANTS)
    party_models = serializers.DictField(
        required=False,
        default=dict,
        help_text="vertical mode only: the participants (by hospital slug, never the first, "
        "the label party, which runs the job's model) that run a model of their own on "
        'their own kind of records, e.g. {"lab": {"model": "tabular_mlp", "input_shape": '
        '[12], "cut": "block1"}} (model_args for a MODULE:FACTORY model); each embedding '
        "must fit the join (sum and mean: the label party's shape; concat: its dimensions)",
    )


@dataclass(frozen=True)
class JobSpec:
    """A job after validation: its description (medsplit's, checked) and what only the
    coordinator keeps (its name, failure policy and participants), ready to store."""

    name: str
    description: JobDescription
    on_failure: str
    max_retries: int
    round_deadline_seconds: int
    participants: tuple[tuple[Hospital, str], ...]  # (hospital, feature set), in turn order


class _Errors:
    """Reasons collected per field."""

    def __init__(self) -> None:
        self.by_field: dict[str, list[str]] = {}

    def add(self, field: str, reason: str) -> None:
        self.by_field.setdefault(field, []).append(reason)

    def __contains__(self, field: str) -> bool:
        return field in self.by_field


#: The request's fields that are the description's too, by the same name.
_DESCRIBED = (
    "model",
    "model_args",
    "num_classes",
    "task",
    "loss",
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
    "augmentation",
    "privacy",
)


def job_spec_validate(*, data: Mapping[str, Any]) -> JobSpec:
    """Check a job's configuration and return it normalised.

    The description's own rules (the mode and its cuts, the optimizers, the codec...) are
    medsplit's (:class:`~medsplit.training.description.JobDescription`); this adds what
    needs the database: the participants, the shape of their data, their labels, and the
    cuts against the model's cut table at that shape.

    Args:
        data: the request body of ``POST /api/jobs/`` (see :class:`JobInput`).

    Returns:
        The :class:`JobSpec` to store.

    Raises:
        InvalidInput: with ``details`` naming every wrong field and all its reasons.
    """
    if not isinstance(data, Mapping):
        raise InvalidInput(
            "a job is a JSON object", details={"non_field_errors": ["not an object"]}
        )
    errors = _Errors()
    known = set(JobInput().fields)
    for key in sorted(set(data) - known):
        errors.add(str(key), f"unknown field; known fields: {', '.join(sorted(known))}")
    syntax = JobInput(data=data)
    syntax.is_valid()
    for field, problems in syntax.errors.items():
        for reason in _flatten(problems):
            errors.add(field, reason)
    # Fields that failed their syntax check are left out of the checks of meaning.
    values = {k: v for k, v in _values(syntax, data).items() if k not in errors}

    # The mode, for the participants' feature sets; the description names an unknown one.
    mode = MODES.get(values.get("mode", ""))
    if mode is not None and not mode.runs_on_platform:
        errors.add(
            "mode",
            f"{mode.name} mode does not run on the platform yet; run it in process with "
            f"`medsplit simulate --mode {mode.name}` or `medsplit verify --mode {mode.name}`",
        )
    elif mode is not None and not _bound(mode, values).runs_on_platform:
        options = values.get("mode_options") or {}
        errors.add(
            "mode_options",
            f"{mode.name} with {options} does not run on the platform yet (its server "
            "segment would serve every hospital's stream from one task, which the "
            f"scheduler does not start); run it in process with `medsplit simulate --mode "
            f"{mode.name}`",
        )
    participants = _check_participants(values, mode, errors)
    own = _party_model_names(values, participants, errors)
    rows = mode is not None and mode.feature_sets  # a vertical party may hold a table
    shape = None
    if participants:
        common = [p for p in participants if p.hospital.slug not in own]
        shape = _common_shape(common, errors, rows=rows)
        _check_own_shapes(values, participants, own, errors)
    spatial_dims, in_channels = _check_dims(values, shape, errors)
    _check_task(values, participants or (), errors)
    _check_labels(values, participants or (), errors)
    described = {name: values[name] for name in _DESCRIBED if name in values}
    if shape is not None:
        described.update(input_shape=list(shape), spatial_dims=spatial_dims)
        described.update(in_channels=in_channels)
    for field, reasons in JobDescription.problems(described, partial=True).items():
        for reason in reasons:
            errors.add(field, reason)
    model = _model_ref(values, errors)
    _check_cuts(values, model, shape, spatial_dims, in_channels, errors)
    _check_party_cuts(values, errors)

    if errors.by_field:
        fields_named = ", ".join(sorted(errors.by_field))
        raise InvalidInput(f"the job is not valid: see {fields_named}", details=errors.by_field)
    assert participants is not None
    description = JobDescription.from_json({"version": FORMAT, **described})
    problem = _vertical_problem(description, tuple(p.hospital.slug for p in participants))
    if problem is not None:
        raise InvalidInput(
            "the job is not valid: see party_models", details={"party_models": [problem]}
        )
    return JobSpec(
        name=values["name"],
        description=description,
        on_failure=values["on_failure"],
        max_retries=values["max_retries"],
        round_deadline_seconds=values["round_deadline_seconds"],
        participants=tuple((p.hospital, p.feature_set) for p in participants),
    )


def _values(syntax: JobInput, data: Mapping[str, Any]) -> dict[str, Any]:
    """Each field's parsed value, for the fields that parsed (defaults filled in)."""
    values: dict[str, Any] = {}
    for name, field in syntax.fields.items():
        raw = data.get(name, serializers.empty)
        try:
            values[name] = field.run_validation(raw)
        except (serializers.ValidationError, SkipField):
            continue  # syntax.errors reports it
    return values


def _flatten(problems: Any, prefix: str = "") -> list[str]:
    """DRF's nested error structure as flat strings (``item 2: hospital: ...``)."""
    if isinstance(problems, Mapping):  # by field name, or by list index (from 0)
        return [
            reason
            for key, value in problems.items()
            for reason in _flatten(
                value, f"{prefix}item {key + 1}: " if isinstance(key, int) else f"{prefix}{key}: "
            )
        ]
    if isinstance(problems, list | tuple):
        if all(isinstance(p, str) for p in problems):
            return [f"{prefix}{p}" for p in problems]
        return [
            r for i, p in enumerate(problems, 1) if p for r in _flatten(p, f"{prefix}item {i}: ")
        ]
    return [f"{prefix}{problems}"]


@dataclass(frozen=True)
class _Participant:
    hospital: Hospital
    feature_set: str


def _check_participants(
    values: dict[str, Any], mode: SplitMode | None, errors: _Errors
) -> list[_Participant] | None:
    """The participants in order, or ``None`` when any of them is unusable."""
    if "participants" not in values:
        return None
    entries = values["participants"]
    slugs = [entry["hospital"] for entry in entries]
    found = {h.slug: h for h in Hospital.objects.filter(slug__in=slugs)}
    ok = True
    seen: set[str] = set()
    for slug in slugs:
        if slug in seen:
            errors.add("participants", f"hospital {slug!r} is listed more than once")
            ok = False
        seen.add(slug)
    for slug in dict.fromkeys(slugs):
        hospital = found.get(slug)
        if hospital is None:
            errors.add("participants", f"no hospital {slug!r}")
            ok = False
        elif hospital.status != Hospital.Status.ENROLLED:
            errors.add(
                "participants",
                f"hospital {slug!r} is not enrolled (status: {hospital.status}); "
                "only enrolled hospitals with a running agent can take part",
            )
            ok = False
        elif hospital.data_problem:
            errors.add(
                "participants",
                f"hospital {slug!r}'s agent is running but reports a problem with its data: "
                f"{hospital.data_problem[:300]}; it must be fixed at the hospital first",
            )
            ok = False
        elif not hospital.dataset_summary:
            errors.add(
                "participants",
                f"hospital {slug!r} has not reported a dataset summary yet; "
                "start its agent so it can report the shape of its data",
            )
            ok = False
    if mode is not None and mode.feature_sets and len(entries) < 2:
        errors.add(
            "participants",
            f"{mode.name} mode needs two or more participants, each holding different "
            "features of the same patients (the first one holds the labels)",
        )
        ok = False
    if mode is not None and not mode.feature_sets:
        for entry in entries:
            if entry.get("feature_set"):
                errors.add(
                    "participants",
                    f"feature_set is used only in modes whose hospitals hold different "
                    f"features of the same patients; {mode.name} mode does not",
                )
                ok = False
                break
    if not ok:
        return None
    return [_Participant(found[e["hospital"]], e.get("feature_set", "")) for e in entries]


def _common_shape(
    participants: list[_Participant], errors: _Errors, *, rows: bool = False
) -> tuple[int, ...] | None:
    """The one image shape every participant reported, or ``None`` (with a reason);
    ``rows``: a table's ``[columns]`` counts as a shape too (a vertical party's)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for p in participants:
        raw = p.hospital.dataset_summary.get("image_shape")
        shape = _as_shape(raw, rows=rows)
        if shape is None:
            errors.add(
                "participants",
                f"hospital {p.hospital.slug!r} reported an unusable image shape {raw!r}; "
                "expected [channels, height, width] or [channels, height, width, depth]"
                + (" (or [columns] for a table)" if rows else ""),
            )
            return None
        shapes[p.hospital.slug] = shape
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{slug} {list(shape)}" for slug, shape in shapes.items())
        errors.add(
            "participants",
            f"participants must all have data of one image shape; they reported: {listed}",
        )
        return None
    return next(iter(shapes.values()))


def _as_shape(raw: object, *, rows: bool = False) -> tuple[int, ...] | None:
    if not isinstance(raw, list | tuple) or len(raw) not in ((1, 3, 4) if rows else (3, 4)):
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in raw):
        return None
    if math.prod(raw) > MAX_INPUT_VALUES:
        return None
    return tuple(raw)


def _check_dims(
    values: dict[str, Any], shape: tuple[int, ...] | None, errors: _Errors
) -> tuple[int | None, int | None]:
    """spatial_dims and in_channels: from the shape, or checked against it when given."""
    spatial_dims = values.get("spatial_dims")
    in_channels = values.get("in_channels")
    if shape is None:
        return spatial_dims, in_channels
    if len(shape) == 1:  # a table's columns: its model's channels; it has no sides
        if in_channels is not None and in_channels != shape[0]:
            errors.add(
                "in_channels",
                f"the participants' table has {shape[0]} columns, so in_channels is "
                f"{shape[0]}, not {in_channels}",
            )
        return 2, shape[0]
    if spatial_dims is not None and spatial_dims != len(shape) - 1:
        errors.add(
            "spatial_dims",
            f"the participants' data has shape {list(shape)}, so spatial_dims is "
            f"{len(shape) - 1}, not {spatial_dims}",
        )
    if in_channels is not None and in_channels != shape[0]:
        errors.add(
            "in_channels",
            f"the participants' data has shape {list(shape)}, so in_channels is "
            f"{shape[0]}, not {in_channels}",
        )
    return len(shape) - 1, shape[0]


def _party_model_names(
    values: dict[str, Any], participants: list[_Participant] | None, errors: _Errors
) -> set[str]:
    """The participants that run a model of their own; each name must be a participant
    other than the first (the label party runs the job's model)."""
    given = values.get("party_models") or {}
    if not isinstance(given, Mapping) or participants is None:
        return set()
    slugs = [p.hospital.slug for p in participants]
    for name in given:
        if name == slugs[0]:
            errors.add(
                "party_models",
                f"{name!r} is the label party (the first participant): it runs the job's "
                "model, so it cannot run one of its own; list another hospital first, or "
                "make this model the job's",
            )
        elif name not in slugs:
            errors.add(
                "party_models",
                f"{name!r} is not a participant of the job ({', '.join(slugs)})",
            )
    return {name for name in given if name in slugs[1:]}


def _check_own_shapes(
    values: dict[str, Any], participants: list[_Participant], own: set[str], errors: _Errors
) -> None:
    """Each party with a model of its own reported records of that model's input shape."""
    given = values.get("party_models") or {}
    for p in participants:
        slug = p.hospital.slug
        if slug not in own or not isinstance(given.get(slug), Mapping):
            continue
        raw = p.hospital.dataset_summary.get("image_shape")
        wanted = given[slug].get("input_shape")
        if _as_shape(raw, rows=True) is None:
            errors.add(
                "participants",
                f"hospital {slug!r} reported an unusable record shape {raw!r}; expected "
                "[columns] for a table or [channels, height, width(, depth)] for images",
            )
        elif list(raw) != list(wanted or []):
            errors.add(
                "party_models",
                f"{slug}: its records are {list(raw)}, its model's input_shape is "
                f"{wanted!r}: they must be the same",
            )


def _check_party_cuts(values: dict[str, Any], errors: _Errors) -> None:
    """Each party's own model is one this coordinator builds, and its cut is in its cut
    table at its input shape."""
    given = values.get("party_models") or {}
    if "party_models" in errors or "num_classes" not in values or not isinstance(given, Mapping):
        return
    for slug, entry in given.items():
        name, args = entry["model"], canonical_model_args(entry.get("model_args") or {})
        if is_factory_name(name):
            listed = model_modules()
            if not module_allowed(factory_module(name), listed.modules):
                errors.add(
                    "party_models",
                    f"{slug}: model module {factory_module(name)!r} is not one the "
                    f"coordinator lists in {MODEL_MODULES_SETTING} "
                    f"({', '.join(listed.modules) or 'none listed'})",
                )
                continue
        shape = tuple(entry["input_shape"])
        rows, problem = _cut_table_cached(
            name, args, max(2, len(shape) - 1), shape[0], values["num_classes"], shape
        )
        if problem is not None:
            errors.add("party_models", f"{slug}: {name} does not run on {list(shape)}: {problem}")
        elif entry["cut"] not in [row.name for row in rows]:
            valid = ", ".join(row.name for row in rows)
            errors.add(
                "party_models", f"{slug}: unknown cut {entry['cut']!r} for {name}; valid: {valid}"
            )


def _vertical_problem(description: JobDescription, participants: tuple[str, ...]) -> str | None:
    """Why the parties' models do not fit together as one vertical model (a front that
    lets more than one tensor cross, embeddings the join cannot combine), or ``None``."""
    if not description.party_models:
        return None
    try:
        with _TRACE_LOCK, torch.no_grad():
            job_vertical_model(
                description.job_model(),
                description.training_config("check"),
                participants,
                description.party_fronts(),
            )
    except (ConfigError, CutError) as e:
        return str(e)
    except Exception as e:  # a factory's own code failed: its error, told
        return f"the parties' models do not run together: {type(e).__name__}: {e}"
    return None


def _data_task(hospital: Hospital) -> str:
    """What a participant's data holds targets for, as its heartbeat said (an agent
    from before tasks says nothing: classification)."""
    return str(hospital.dataset_summary.get("task") or DEFAULT_TASK)


def _check_task(
    values: dict[str, Any], participants: list[_Participant] | tuple, errors: _Errors
) -> None:
    """Every participant's data holds the job's kind of target: a segmentation job needs
    masks at every hospital, a classification job labels."""
    task = values.get("task")
    if task is None:
        return
    for p in participants:
        held = _data_task(p.hospital)
        if held == task:
            continue
        if task == SEGMENTATION:
            reason = (
                f"hospital {p.hospital.slug!r} reports {held} data (a label per image, no "
                "masks); a segmentation job needs a mask per image at every participant "
                "(its agent's data.task = segmentation)"
            )
        else:
            reason = (
                f"hospital {p.hospital.slug!r} reports {held} data (a mask per image, no "
                f"labels); a {task} job needs a label per image at every participant"
            )
        errors.add("participants", reason)


def _check_labels(
    values: dict[str, Any], participants: list[_Participant] | tuple, errors: _Errors
) -> None:
    """num_classes must cover every label (every mask class) a participant reported."""
    if "num_classes" not in values:
        return
    labels: set[str] = set()
    for p in participants:
        key = "mask_classes" if _data_task(p.hospital) == SEGMENTATION else "label_counts"
        counts = p.hospital.dataset_summary.get(key) or {}
        if isinstance(counts, Mapping):
            labels.update(str(label) for label in counts)
    needed = len(labels)
    numeric = [int(label) for label in labels if label.isdigit()]
    if numeric:
        needed = max(needed, max(numeric) + 1)
    if values["num_classes"] < needed:
        shown = ", ".join(sorted(labels, key=lambda s: (len(s), s)))
        errors.add(
            "num_classes",
            f"the participants report labels {shown}, so num_classes must be at least "
            f"{needed}, not {values['num_classes']}",
        )


@dataclass(frozen=True)
class _ModelRef:
    """The job's model as the caches key it: its name, a factory's arguments as canonical
    JSON (``""`` for a registry model), and the shape its cuts are checked at while the
    participants give none (``None`` for a factory: it has no default)."""

    name: str
    args: str
    default_shape: tuple[int, ...] | None


def _model_ref(values: dict[str, Any], errors: _Errors) -> _ModelRef | None:
    """The job's model, once its name and arguments are valid and, for a ``MODULE:FACTORY``
    model, its module is in ``MEDSPLIT["MODEL_MODULES"]``."""
    if "model" in errors or "model" not in values or "model_args" in errors:
        return None
    name = values["model"]
    if not is_factory_name(name):
        spec = get_model_spec(name)
        return _ModelRef(spec.name, "", spec.default_input_shape)
    module = factory_module(name)
    listed = model_modules()
    if not module_allowed(module, listed.modules):
        errors.add(
            "model",
            f"model module {module!r} is not one the coordinator lists in "
            f"{MODEL_MODULES_SETTING} ({', '.join(listed.modules) or 'none listed'}): a "
            "factory's module runs code on the coordinator, the workers and every "
            "participant, so each lists those it trusts (each participant's agent in its "
            "model_modules too)",
        )
        return None
    return _ModelRef(name, canonical_model_args(values.get("model_args") or {}), None)


def _check_cuts(
    values: dict[str, Any],
    model: _ModelRef | None,
    shape: tuple[int, ...] | None,
    spatial_dims: int | None,
    in_channels: int | None,
    errors: _Errors,
) -> tuple[str, ...]:
    """The cuts exist in the model's cut table and split the model (their number for the
    mode is the description's rule)."""
    if "cuts" not in values:
        return ()
    cuts = tuple(values["cuts"])
    if model is None or "num_classes" not in values or "spatial_dims" in errors:
        return cuts
    num_classes = values["num_classes"]
    # Cut names are checked at the participants' shape, or at the model's default one
    # while the participants give none, so an unknown cut is reported either way (a
    # factory has no default: its cuts wait for the participants).
    table_shape = shape or model.default_shape
    if table_shape is None:
        return cuts
    table_dims = spatial_dims if shape is not None else len(table_shape) - 1
    table_channels = (in_channels if shape is not None else None) or table_shape[0]
    rows, problem = _cut_table_cached(
        model.name, model.args, table_dims, table_channels, num_classes, tuple(table_shape)
    )
    if problem is not None:
        if shape is not None:
            errors.add(
                "model",
                f"{model.name} does not fit the participants' data shape {list(shape)}: {problem}",
            )
        return cuts
    task = values.get("task", DEFAULT_TASK)
    if shape is not None and (is_factory_name(model.name) or task != DEFAULT_TASK):
        # A registry model is built with num_classes; a factory's arguments decide it.
        # Whether it outputs a mask's logits or one sample's is the model's either way.
        field, problem = _output_problem(model.name, model.args, tuple(shape), num_classes, task)
        if problem is not None:
            errors.add(field, problem)
            return cuts
    valid = [row.name for row in rows]
    unknown = [cut for cut in cuts if cut not in valid]
    for cut in unknown:
        errors.add("cuts", f"unknown cut {cut!r} for {model.name}; valid cuts: {', '.join(valid)}")
    if unknown or shape is None or "cuts" in errors or "in_channels" in errors:
        return cuts
    problem = _split_error(
        model.name, model.args, spatial_dims, in_channels, num_classes, shape, cuts
    )
    if problem is not None:
        errors.add("cuts", problem)
    return cuts


# -- the cached, expensive part ---------------------------------------------------------

#: Serialises model builds and traces in this process. torch.fx patches
#: ``nn.Module.__call__`` globally while it traces, so two threads tracing at once could
#: see each other's patches; it also keeps a burst of requests to one CPU-heavy trace at
#: a time.
_TRACE_LOCK = threading.Lock()


@lru_cache(maxsize=4)
def _model(
    name: str, args: str, spatial_dims: int, in_channels: int, num_classes: int
) -> nn.Module:
    """A built model, shared by the caches below: only ever traced, never trained.

    A factory is sized on the meta device first (no memory), so that its arguments
    cannot make the coordinator allocate more than :data:`MAX_FACTORY_PARAMETERS`.

    Raises:
        ConfigError: a factory whose module is not listed, that cannot be imported, that
            refuses its arguments or fails, or that is too large.
    """
    if not is_factory_name(name):
        return build_model(
            name,
            spatial_dims=spatial_dims,
            in_channels=in_channels,
            num_classes=num_classes,
            seed=0,
        )
    listed = model_modules()
    model_args = json.loads(args or "{}")

    def build(**kwargs: Any) -> nn.Module:
        return build_factory_model(
            name,
            model_args,
            allowed_modules=listed.modules,
            setting=listed.setting,
            **kwargs,
        )

    try:
        require_model_module(name)  # before anything of it is imported
        # Imported outside the meta device, so that tensors its import makes are real.
        importlib.import_module(factory_module(name))
        try:
            with torch.device("meta"):
                sized = build()
        except (UnknownModelError, ConfigError):
            raise
        except Exception:  # code that meta tensors cannot run: sized once built instead
            sized = None
        if sized is not None:
            count = sum(p.numel() for p in sized.parameters())
            if count > MAX_FACTORY_PARAMETERS:
                raise ConfigError(
                    f"{name} with these model_args has {count:,} parameters; the "
                    f"coordinator builds models of at most {MAX_FACTORY_PARAMETERS:,}"
                )
        return build(seed=0)
    except UnknownModelError as e:
        raise ConfigError(str(e)) from e
    except ConfigError:
        raise
    except ImportError as e:
        raise ConfigError(f"cannot import model module {factory_module(name)!r}: {e}") from e
    except Exception as e:  # the factory's own code failed: its error, told
        raise ConfigError(f"{name} failed to build: {type(e).__name__}: {e}") from e


@lru_cache(maxsize=32)
def _cut_table_cached(
    name: str,
    args: str,
    spatial_dims: int,
    in_channels: int,
    num_classes: int,
    shape: tuple[int, ...],
) -> tuple[tuple[CutInfo, ...], str | None]:
    """The cut table at ``shape``, or the reason the model does not run on it."""
    with _TRACE_LOCK:
        return _cut_table_traced(name, args, spatial_dims, in_channels, num_classes, shape)


def _cut_table_traced(
    name: str,
    args: str,
    spatial_dims: int,
    in_channels: int,
    num_classes: int,
    shape: tuple[int, ...],
    depth: int | None = None,
) -> tuple[tuple[CutInfo, ...], str | None]:
    """:func:`_cut_table_cached`'s work, with ``_TRACE_LOCK`` held by the caller."""
    try:
        with torch.no_grad():
            model = _model(name, args, spatial_dims, in_channels, num_classes)
            return tuple(cut_table(model, torch.zeros(2, *shape), depth=depth)), None
    except (CutError, ConfigError) as e:
        return (), str(e)


@lru_cache(maxsize=32)
def _output_problem(
    name: str, args: str, shape: tuple[int, ...], num_classes: int, task: str = DEFAULT_TASK
) -> tuple[str, str | None]:
    """The field and the reason a model does not end in ``num_classes`` logits per
    sample (a segmentation job's: per pixel) at ``shape`` (every frame check and loss
    takes them so), or no reason."""
    try:
        with _TRACE_LOCK, torch.no_grad():
            model = _model(name, args, len(shape) - 1, shape[0], num_classes)
            training = model.training
            model.eval()  # the cached model's batch-norm statistics stay as built
            try:
                out = model(torch.zeros(2, *shape))
            finally:
                model.train(training)
    except ConfigError as e:
        return "model", str(e)
    except Exception as e:  # the factory's own forward: its error, told
        return "model", f"{name} does not run on the participants' data shape: {e}"
    if task != DEFAULT_TASK:
        try:
            check_model_output(task, out, input_shape=shape, num_classes=num_classes)
        except ConfigError as e:
            return "model", f"{name}: {e}"
        return "model", None
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 2:
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return "model", (
            f"{name} gives {got} for a batch of 2, not logits [batch, num_classes]: a job's "
            "model ends in one logit per class"
        )
    if out.shape[1] != num_classes:
        return "num_classes", (
            f"{name} with these model_args gives {out.shape[1]} logits per sample, so "
            f"num_classes is {out.shape[1]}, not {num_classes}"
        )
    return "model", None


@lru_cache(maxsize=32)
def _split_error(
    name: str,
    args: str,
    spatial_dims: int,
    in_channels: int,
    num_classes: int,
    shape: tuple[int, ...],
    cuts: tuple[str, ...],
) -> str | None:
    """Why ``split_model`` refuses these cuts at ``shape``, or ``None`` when it accepts."""
    try:
        with _TRACE_LOCK:
            model = _model(name, args, spatial_dims, in_channels, num_classes)
            split_model(model, torch.zeros(2, *shape), cuts)
    except (CutError, ConfigError) as e:
        return str(e)
    return None


def parse_input_shape(raw: str | None) -> tuple[int, ...]:
    """``"1,28,28"`` as a shape, within the cut table's bounds.

    Raises:
        InvalidInput: not channels,height,width[,depth] as positive integers.
        InputTooLarge: a side, the channels or the values in all beyond the bounds
            (:data:`CUT_TABLE_MAX_SIDE`, :data:`CUT_TABLE_MAX_CHANNELS`,
            :data:`CUT_TABLE_MAX_VALUES`); the message names the one passed.
    """
    try:
        shape = tuple(int(part) for part in (raw or "").split(","))
    except ValueError:
        shape = ()
    if len(shape) not in (3, 4) or any(d < 1 for d in shape):
        raise InvalidInput(
            "input_shape is not a usable shape",
            details={
                "input_shape": [
                    "give channels,height,width (or channels,height,width,depth) as positive "
                    f"integers; got {raw!r}"
                ]
            },
        )
    problems = []
    if shape[0] > CUT_TABLE_MAX_CHANNELS:
        problems.append(f"at most {CUT_TABLE_MAX_CHANNELS} channels, got {shape[0]}")
    if max(shape[1:]) > CUT_TABLE_MAX_SIDE:
        problems.append(
            f"each side at most {CUT_TABLE_MAX_SIDE}, got {'x'.join(map(str, shape[1:]))}"
        )
    if math.prod(shape) > CUT_TABLE_MAX_VALUES:
        problems.append(
            f"at most {CUT_TABLE_MAX_VALUES} values per sample (channels x sides), "
            f"got {math.prod(shape)}"
        )
    if problems:
        raise InputTooLarge(
            f"input_shape {list(shape)} is larger than the cut table is worked out for: "
            f"{'; '.join(problems)}. The cuts are the same at every size; ask at a smaller "
            "shape and scale the crossing sizes",
            details={"input_shape": problems},
        )
    return shape


def parse_depth(raw: str | None) -> int | None:
    """A cut table's ``depth`` (how many names deep its rows go), within its bounds;
    ``None`` for the default (down to where the crossing tensors change).

    Raises:
        InvalidInput: not an integer from 1 to ``MAX_DEPTH``.
    """
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_DEPTH:
        raise InvalidInput(
            "the cut table's depth is not valid",
            details={"depth": [f"must be an integer from 1 to {MAX_DEPTH}, got {raw!r:.20}"]},
        )
    return int(raw)


def model_cut_table(
    *,
    model_name: str,
    input_shape: tuple[int, ...],
    depth: int | None = None,
    model_args: str = "",
) -> list[dict[str, Any]]:
    """The cut table of a model at ``input_shape`` (``depth``: its rows that many names
    deep; default: :func:`~medsplit.cutting.cut_table`'s) as JSON rows, from the cache
    every process shares when any process worked it out before. A ``MODULE:FACTORY``
    model (``model_args``: canonical JSON, :func:`parse_factory_args`) is worked out only
    when its module is in ``MEDSPLIT["MODEL_MODULES"]``.

    Raises:
        NotFound: no such model in the registry.
        InvalidInput: the model does not run on inputs of that shape, or is a factory
            this coordinator does not list or cannot build with these arguments.
        TooManyRequests: this process is working out another cut table and did not
            finish within :data:`CUT_TABLE_WAIT_SECONDS`.
    """
    if is_factory_name(model_name):
        name = _listed_factory(model_name)
    else:
        try:
            name = get_model_spec(model_name).name
        except UnknownModelError as e:
            raise NotFound(str(e)) from None
    shape = tuple(input_shape)
    key = f"cut-table:{name}:{','.join(map(str, shape))}:{depth or 'default'}"
    if model_args:  # by their digest: a key of bounded length whatever they are
        key += f":args-{hashlib.sha256(model_args.encode()).hexdigest()[:32]}"
    cached = cache.get(key)
    if cached is None:
        # One trace at a time per process (_TRACE_LOCK); a request that cannot have it
        # soon is answered rather than holding a thread for as long as others queue.
        if not _TRACE_LOCK.acquire(timeout=CUT_TABLE_WAIT_SECONDS):
            raise TooManyRequests(
                "the coordinator is working out other cut tables: try again in a few seconds",
                retry_after=5,
            )
        try:
            rows, problem = _cut_table_traced(
                name, model_args, len(shape) - 1, shape[0], 2, shape, depth
            )
        finally:
            _TRACE_LOCK.release()
        cached = {"rows": [row.to_json() for row in rows], "problem": problem}
        cache.set(key, cached, timeout=CUT_TABLE_CACHE_SECONDS)
    if cached["problem"] is not None:
        field = "model_args" if model_args else "input_shape"
        raise InvalidInput(
            f"{name} does not run on inputs of shape {list(shape)}",
            details={field: [cached["problem"]]},
        )
    return cached["rows"]


def _listed_factory(name: str) -> str:
    """``name``, a ``MODULE:FACTORY`` model whose module the coordinator lists.

    Raises:
        InvalidInput: a malformed name, or a module not in ``MEDSPLIT["MODEL_MODULES"]``
            (nothing imported).
    """
    try:
        module = factory_module(name)
    except UnknownModelError as e:
        raise InvalidInput(str(e), details={"model": [str(e)]}) from None
    listed = model_modules()
    if not module_allowed(module, listed.modules):
        reason = (
            f"model module {module!r} is not one the coordinator lists in "
            f"{MODEL_MODULES_SETTING} ({', '.join(listed.modules) or 'none listed'}); "
            "its cut table is worked out only for the modules listed"
        )
        raise InvalidInput(reason, details={"model": [reason]})
    return name


def parse_factory_args(raw: str | None) -> str:
    """A cut table's ``model_args`` query parameter as canonical JSON (``""``: none).

    Raises:
        InvalidInput: not a JSON object of at most ``MAX_ARGS_BYTES`` bytes.
    """
    try:
        args = parse_model_args(raw)
        return canonical_model_args(args) if args else ""
    except ConfigError as e:
        raise InvalidInput("model_args is not valid", details={"model_args": [str(e)]}) from None


def _bound(mode: SplitMode, values: Mapping[str, Any]) -> SplitMode:
    """``mode`` with the job's options; itself where they are wrong (the description's
    own checks name what is wrong with them)."""
    try:
        return mode.with_options(values.get("mode_options") or {})
    except ConfigError:
        return mode
