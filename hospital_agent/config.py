"""The agent's configuration: a TOML file, then environment variables, then flags.

Example ``agent.toml``::

    coordinator_url = "https://coordinator.example.org"
    work_dir = "/var/lib/medsplit-agent"
    enrolment_code = "msc_..."        # first run only; the agent keeps its token afterwards
    device = "cpu"                    # or "cuda"
    # ca_bundle = "/etc/ssl/certs/consortium-ca.pem"

    [data]
    kind = "folder"                   # "medmnist", "folder", "synthetic" or "table"
    path = "/data/chest-xrays"
    labels_csv = "labels.csv"         # folder: columns file,label
    val_fraction = 0.2
    # task = "segmentation"           # a mask per image: images/ and masks/ of one name,
    # masks_csv = "masks.csv"         # or a CSV of columns image,mask
    # test_path = "/data/chest-xrays-test"   # a local test set (medmnist: the archive's
    #                                        # test split by default; data.test = false: none)

:data:`KEYS` is the one list of keys. Each key ``name`` (``data.<name>`` for the
``[data]`` table) is also the environment variable ``MEDSPLIT_AGENT_<NAME>``
(``MEDSPLIT_AGENT_DATA_<NAME>``) and the flag ``--<name>`` (``--data-<name>``), with
underscores as dashes. Flags win over the environment, which wins over the file. The
README's table of keys is checked against :data:`KEYS` by the tests.
"""

from __future__ import annotations

import argparse
import math
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hospital_agent.data import DEFAULT_VAL_FRACTION, DataSource
from hospital_agent.data.sources import DATA_TASKS, DEFAULT_ID_COLUMN, KINDS
from hospital_agent.data.testset import TestSettings
from medsplit.errors import ConfigError
from medsplit.models.factory import model_module_names

ENV_PREFIX = "MEDSPLIT_AGENT_"
DEVICES = ("cpu", "cuda")
DATA = "data"
"""The one TOML table; its keys are named ``data.<key>``."""

# What a value must be, in the words of the error messages.
_KINDS_OF_VALUE: dict[type, str] = {
    str: "text",
    Path: "text",
    int: "an integer",
    float: "a number",
    tuple: "like 1,28,28",
    bool: "true or false",
}
_METAVARS: dict[type, str] = {
    str: "TEXT",
    Path: "PATH",
    int: "N",
    float: "X",
    tuple: "N,N,...",
    bool: "true|false",
}
_TRUE, _FALSE = frozenset({"1", "true", "yes", "on"}), frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class Key:
    """One configuration key: its name, what its value must be, and its default.

    Attributes:
        name: ``"reply_timeout"`` or, in the ``[data]`` table, ``"data.seed"``.
        type: ``str``, ``Path``, ``int``, ``float`` or ``tuple`` (integers, written
            ``1,28,28`` in the environment and flags, a list or that text in the file).
        default: the value when no source sets it; ``None`` for "not set".
        help: one line for ``--help`` and the README.
        choices: the only values allowed, if any.
        required: the agent cannot start without it (an empty value counts as unset).
        check: a further test of the converted value; ``must`` says what it wants
            ("be in [0, 1)") for the error message.
        metavar: the placeholder in ``--help``; derived from the type when empty.
    """

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    required: bool = False
    check: Callable[[Any], bool] | None = None
    must: str = ""
    metavar: str = ""

    @property
    def section(self) -> str:
        """``"data"`` for the keys of the ``[data]`` table, ``""`` for top-level ones."""
        return self.name.partition(".")[0] if "." in self.name else ""

    @property
    def field(self) -> str:
        """The name inside its table: ``seed`` for ``data.seed``."""
        return self.name.rpartition(".")[2]

    @property
    def dest(self) -> str:
        """The key of ``load_config``'s ``flags`` mapping (and argparse's ``dest``)."""
        return self.name.replace(".", "_")

    @property
    def env(self) -> str:
        """Its environment variable."""
        return ENV_PREFIX + self.dest.upper()

    @property
    def flag(self) -> str:
        """Its command-line flag."""
        return "--" + self.dest.replace("_", "-")

    @property
    def default_text(self) -> str:
        """The default as ``--help`` and the README show it: ``""`` when there is none."""
        if self.required:
            return "required"
        return "" if self.default is None else _text(self.default)

    def parse(self, value: Any, where: str) -> Any:
        """Convert ``value`` (text from the environment or a flag, or a TOML value) and
        check it.

        Raises:
            ConfigError: naming the key and ``where`` the value came from.
        """
        converted = _convert(self, value, where)
        if self.choices and converted not in self.choices:
            raise ConfigError(
                f"{self.name} must be one of {', '.join(self.choices)}, got {value!r} ({where})"
            )
        if self.check is not None and not self.check(converted):
            raise ConfigError(f"{self.name} must {self.must}, got {value!r} ({where})")
        return converted


def _module_names_ok(text: str) -> bool:
    try:
        model_module_names(text)
    except ConfigError:
        return False
    return True


KEYS: tuple[Key, ...] = (
    Key("coordinator_url", str, None, "the coordinator's address",
        required=True, check=lambda url: url.startswith(("https://", "http://")),
        must="start with https:// (or http:// on a test bench)", metavar="URL"),
    Key("work_dir", Path, None, "where the agent keeps its key, token and snapshots",
        required=True),
    Key("enrolment_code", str, None, "the one-time code to enrol with; first run only",
        metavar="CODE"),
    Key("device", str, "cpu", "where the agent's layers run", choices=DEVICES),
    Key("ca_bundle", str, None,
        "a CA bundle that checks the coordinator and a rediss:// relay", metavar="PATH"),
    Key("heartbeat_seconds", float, 30.0, "seconds between heartbeats",
        check=lambda s: s > 0, must="be > 0", metavar="SECONDS"),
    Key("poll_seconds", float, 25.0, "how long one poll for assignments waits at the coordinator",
        check=lambda s: s >= 0, must="be >= 0", metavar="SECONDS"),
    Key("reply_timeout", float, 600.0, "how long a turn waits for the worker's reply",
        check=lambda s: s > 0, must="be > 0", metavar="SECONDS"),
    Key("deterministic", bool, True,
        "deterministic kernels only, as the workers use, so that a job equals unsplit "
        "training bit for bit on cuda too (sets CUBLAS_WORKSPACE_CONFIG)"),
    Key("report_loss", bool, True,
        "in modes whose loss is computed here (U-shaped), tell the coordinator this "
        "hospital's training loss (one number, about once a second) for its dashboard"),
    Key("extra_modes", str, None,
        "split-learning modes this agent runs beyond the built-in ones, "
        "package.module:ClassName separated by commas", metavar="MODULE:CLASS,..."),
    Key("model_modules", str, None,
        "modules whose MODULE:FACTORY models this agent builds for a job (a listed package "
        "allows its modules), separated by commas; unset: only the registry's models",
        check=_module_names_ok, must="be dotted module names separated by commas",
        metavar="MODULE,..."),
    Key("data.kind", str, None, "where the images (or, vertical jobs only, a table) come from",
        choices=KINDS, required=True),
    Key("data.task", str, "classification",
        "classification: a label per image; segmentation: a mask per image (folder: "
        "images/ and masks/ of one file name, or masks_csv; synthetic: generated masks)",
        choices=DATA_TASKS),
    Key("data.path", str, None,
        "medmnist: the .npz archive; folder: the folder of images; table: the CSV file",
        metavar="PATH"),
    Key("data.split", str, "train", "medmnist: the archive's split that is the hospital's pool",
        metavar="SPLIT"),
    Key("data.labels_csv", str, None,
        "folder: the CSV of labels (file,label), relative to the folder; labels.csv there "
        "when unset", metavar="PATH"),
    Key("data.masks_csv", str, None,
        "folder, segmentation: a CSV of pairs (image,mask), relative to the folder; "
        "images/ and masks/ pair by file name when unset", metavar="PATH"),
    Key("data.samples", int, 0, "synthetic: how many images (needed, at least 1)"),
    Key("data.num_classes", int, 2,
        "synthetic: how many classes (segmentation: the background counts as one)"),
    Key("data.shape", tuple, (1, 28, 28), "synthetic: the images' shape, C,H,W or C,D,H,W",
        metavar="C,H,W"),
    Key("data.identifiers_csv", str, None,
        "medmnist, vertical jobs: a CSV with the header id, one identifier per image of the "
        "split, in order; relative to the archive's folder", metavar="PATH"),
    Key("data.id_column", str, DEFAULT_ID_COLUMN, "table: the identifier column",
        metavar="COLUMN"),
    Key("data.feature_columns", str, None,
        "table: the numeric feature columns, separated by commas; every column but the "
        "identifier and label columns when unset", metavar="COLUMN,..."),
    Key("data.label_column", str, None,
        "table: the integer label column (the label party's); no labels when unset",
        metavar="COLUMN"),
    Key("data.seed", int, 0, "synthetic: the images' seed; every kind: the local split's seed"),
    Key("data.val_fraction", float, DEFAULT_VAL_FRACTION,
        "the share of the pool kept aside, locally, for validation",
        check=lambda f: 0 <= f < 1, must="be in [0, 1)"),
    Key("data.test", bool, True,
        "keep a local test set, where one is given, to evaluate a completed job's final "
        "model on through the split; false: no test set"),
    Key("data.test_path", str, None,
        "medmnist: another archive holding the test split; folder: the test set's own "
        "folder (its labels.csv, or images/ and masks/)", metavar="PATH"),
    Key("data.test_split", str, None,
        "medmnist: the archive's split that is the test set; test when unset, if the "
        "archive holds one", metavar="SPLIT"),
    Key("data.test_labels_csv", str, None,
        "folder: the test set's CSV of labels (file,label), relative to data.test_path, "
        "else to data.path", metavar="PATH"),
    Key("data.test_masks_csv", str, None,
        "folder, segmentation: the test set's CSV of pairs (image,mask), relative to "
        "data.test_path, else to data.path", metavar="PATH"),
    Key("data.test_samples", int, 0,
        "synthetic: how many test images (drawn with the seed data.seed + 1); 0: none",
        check=lambda n: n >= 0, must="be >= 0"),
    Key("data.test_identifiers_csv", str, None,
        "a vertical party's medmnist archive: the CSV of its test split's identifiers "
        "(header id, one row per image); without it, no test set", metavar="PATH"),
)  # fmt: skip
#: The ``data.test_*`` keys, by their field in :class:`TestSettings`.
TEST_KEYS = {"test": "enabled", "test_path": "path", "test_split": "split",
             "test_labels_csv": "labels_csv", "test_masks_csv": "masks_csv",
             "test_samples": "samples", "test_identifiers_csv": "identifiers_csv"}  # fmt: skip
_BY_NAME = {key.name: key for key in KEYS}
_BY_DEST = {key.dest: key for key in KEYS}


def _default(name: str) -> Any:
    return _BY_NAME[name].default


@dataclass(frozen=True)
class AgentConfig:
    """Everything the agent is told; see the module docstring for where it comes from."""

    coordinator_url: str
    work_dir: Path
    data: DataSource
    val_fraction: float = _default("data.val_fraction")
    split_seed: int = _default("data.seed")
    enrolment_code: str | None = _default("enrolment_code")
    device: str = _default("device")
    ca_bundle: str | None = _default("ca_bundle")
    heartbeat_seconds: float = _default("heartbeat_seconds")
    poll_seconds: float = _default("poll_seconds")
    reply_timeout: float = _default("reply_timeout")
    deterministic: bool = _default("deterministic")
    extra_modes: str | None = _default("extra_modes")
    model_modules: str | None = _default("model_modules")
    report_loss: bool = _default("report_loss")
    test: TestSettings = field(default_factory=TestSettings)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Add a flag for every key of :data:`KEYS` to ``parser``, in one group per table.

    The flags keep their values as text (``None`` when not given): :func:`load_config`
    converts them, so a bad flag is refused with the same message as a bad variable.
    """
    groups = {
        "": parser.add_argument_group(
            "coordinator", "the top-level keys of agent.toml: the coordinator and this agent"
        ),
        DATA: parser.add_argument_group(DATA, "the [data] table of agent.toml: the local images"),
    }
    for key in KEYS:
        notes = [key.env]
        if key.default_text:
            notes.append(key.default_text if key.required else f"default {key.default_text}")
        groups[key.section].add_argument(
            key.flag,
            dest=key.dest,
            metavar=key.metavar or _metavar(key),
            # argparse formats help with %; a literal one must be doubled.
            help=f"{key.help} ({'; '.join(notes)})".replace("%", "%%"),
        )


def config_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The values of :func:`add_config_flags`' flags in ``args``, as ``load_config`` takes them."""
    return {key.dest: getattr(args, key.dest, None) for key in KEYS}


def load_config(
    *, file: str | os.PathLike[str] | None, flags: Mapping[str, Any], env: Mapping[str, str]
) -> AgentConfig:
    """Merge the TOML ``file``, ``env`` (``MEDSPLIT_AGENT_*``) and ``flags`` (keyed by
    :attr:`Key.dest`, e.g. ``data_seed``; ``None`` values are not given), check every
    value, and return the configuration.

    Raises:
        ConfigError: naming the key that is missing or wrong, and where it came from.
    """
    raw: dict[str, tuple[Any, str]] = {}  # key name -> (value, where it came from)
    unknown: list[str] = []
    if file is not None:
        for name, value, where in _read_file(Path(file)):
            if name in _BY_NAME:
                raw[name] = (value, where)
            else:
                unknown.append(f"{name} ({where})")
    for key in KEYS:
        if (value := env.get(key.env)) is not None:
            raw[key.name] = (value, key.env)
    for dest, value in flags.items():
        if value is None:
            continue
        if dest in _BY_DEST:
            key = _BY_DEST[dest]
            raw[key.name] = (value, key.flag)
        else:
            unknown.append(f"{dest} (--{dest.replace('_', '-')})")
    if unknown:
        raise ConfigError(f"unknown configuration keys: {', '.join(unknown)}")

    values: dict[str, Any] = {}
    for key in KEYS:
        value, where = raw.get(key.name, (None, ""))
        if value is None or (value == "" and (key.required or key.default is None)):
            # An empty text (``MEDSPLIT_AGENT_CA_BUNDLE=``) unsets an optional key.
            if key.required:
                raise ConfigError(_not_set(key))
            values[key.name] = key.default
        else:
            values[key.name] = key.parse(value, where)

    data = {k.field: values[k.name] for k in KEYS if k.section == DATA}
    val_fraction = data.pop("val_fraction")
    test = TestSettings(**{attr: data.pop(name) for name, attr in TEST_KEYS.items()})
    top = {k.field: values[k.name] for k in KEYS if not k.section}
    return AgentConfig(
        **{**top, "coordinator_url": top["coordinator_url"].rstrip("/")},
        data=DataSource(**data),
        val_fraction=val_fraction,
        split_seed=data["seed"],
        test=test,
    )


def _read_file(path: Path) -> list[tuple[str, Any, str]]:
    """The file's ``(key name, value, where)``, ``[data]`` keys named ``data.<key>``."""
    try:
        parsed = tomllib.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read the configuration file {path}: {e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}") from e
    found: list[tuple[str, Any, str]] = []
    for name, value in parsed.items():
        if name == DATA and isinstance(value, dict):
            found.extend((f"{DATA}.{k}", v, f"{path} [{DATA}]") for k, v in value.items())
        else:
            found.append((name, value, str(path)))
    return found


def _not_set(key: Key) -> str:
    one_of = f" (one of {', '.join(key.choices)})" if key.choices else ""
    return f"{key.name} is not set{one_of}: give it in the file, as {key.env} or as {key.flag}"


def _convert(key: Key, value: Any, where: str) -> Any:
    wrong = ConfigError(f"{key.name} must be {_KINDS_OF_VALUE[key.type]}, got {value!r} ({where})")
    if key.type is bool:
        if isinstance(value, bool):
            return value
        text = value.strip().lower() if isinstance(value, str) else None
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise wrong
    # bool is an int to Python, but `true` for a number is a mistake in the file.
    if isinstance(value, bool):
        raise wrong
    if key.type in (str, Path):
        if not isinstance(value, str):
            raise wrong
        return Path(value).expanduser() if key.type is Path else value
    if key.type is tuple:
        parts = value.split(",") if isinstance(value, str) else value
        if not isinstance(parts, list | tuple) or any(isinstance(p, bool | float) for p in parts):
            raise wrong
        try:
            return tuple(int(p) for p in parts)
        except (TypeError, ValueError):
            raise wrong from None
    if key.type is int:
        # A float from the file would be truncated silently by int().
        if isinstance(value, float):
            raise wrong
    elif not isinstance(value, str | int | float):
        raise wrong
    try:
        converted = key.type(value)
    except (TypeError, ValueError):
        raise wrong from None
    if isinstance(converted, float) and math.isnan(converted):
        raise wrong
    return converted


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _metavar(key: Key) -> str:
    if key.choices:
        return "{" + ",".join(key.choices) + "}"
    return _METAVARS[key.type]
