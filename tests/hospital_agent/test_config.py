"""The agent's configuration: every key of ``config.KEYS`` arrives, typed, from the file,
the environment and the real command line; flags win over the environment, which wins over
the file; bad values name the key and where they came from; the README lists the keys."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from hospital_agent import cli
from hospital_agent.config import (
    KEYS,
    TEST_KEYS,
    AgentConfig,
    Key,
    config_flags,
    load_config,
)
from hospital_agent.data import DataSource
from medsplit.errors import ConfigError

README = Path(__file__).parents[2] / "hospital_agent" / "README.md"

# Two values per key, both unlike the base below, the first unlike the default too: a key
# added to KEYS without a line here fails test_every_key_has_samples.
SAMPLES: dict[str, tuple[Any, Any]] = {
    "coordinator_url": ("https://sample.example", "http://bench.example:8000"),
    "work_dir": (Path("/srv/sample"), Path("/srv/other")),
    "enrolment_code": ("msc_sample", "msc_other"),
    "device": ("cuda", "cpu"),
    "ca_bundle": ("/etc/ssl/sample.pem", "/etc/ssl/other.pem"),
    "heartbeat_seconds": (7.5, 2.0),
    "poll_seconds": (3.0, 0.0),
    "reply_timeout": (45.0, 120.5),
    "deterministic": (False, True),
    "report_loss": (False, True),
    "extra_modes": ("lab.modes:Toy", "lab.modes:Toy,lab.other:Mode"),
    "model_modules": ("lab.models", "lab.models,monai.networks.nets"),
    "data.kind": ("synthetic", "medmnist"),
    "data.path": ("/data/sample", "/data/other"),
    "data.split": ("val", "test"),
    "data.labels_csv": ("sample.csv", "other.csv"),
    "data.task": ("segmentation", "classification"),
    "data.masks_csv": ("pairs.csv", "other-pairs.csv"),
    "data.samples": (12, 48),
    "data.num_classes": (3, 5),
    "data.shape": ((3, 32, 32), (1, 8, 16, 16)),
    "data.identifiers_csv": ("ids.csv", "/data/other-ids.csv"),
    "data.id_column": ("patient", "pid"),
    "data.feature_columns": ("age,ldl", "hba1c"),
    "data.label_column": ("outcome", "y"),
    "data.seed": (7, 11),
    "data.val_fraction": (0.3, 0.0),
    "data.test": (False, True),
    "data.test_path": ("/data/test", "/data/other-test"),
    "data.test_split": ("val", "train"),
    "data.test_labels_csv": ("test.csv", "other-test.csv"),
    "data.test_masks_csv": ("test-pairs.csv", "other-test-pairs.csv"),
    "data.test_samples": (8, 16),
    "data.test_identifiers_csv": ("test-ids.csv", "other-test-ids.csv"),
}
# What every case starts from, in the file: just enough for a valid configuration that
# each sample above can change alone.
BASE: dict[str, Any] = {
    "coordinator_url": "https://base.example",
    "work_dir": Path("/srv/base"),
    "data.kind": "folder",
    "data.path": "/data/base",
    "data.samples": 30,
}
# Text refused from any source (the file gets it as a TOML string).
BAD_TEXT: list[tuple[str, str]] = [
    ("coordinator_url", "ftp://files.example"),
    ("device", "tpu"),
    ("heartbeat_seconds", "soon"),
    ("heartbeat_seconds", "0"),
    ("poll_seconds", "-1"),
    ("reply_timeout", "0"),
    ("reply_timeout", "nan"),
    ("deterministic", "sometimes"),
    ("model_modules", "lab.models:net"),
    ("data.kind", "dicom"),
    ("data.task", "detection"),
    ("data.samples", "many"),
    ("data.samples", "2.5"),
    ("data.num_classes", "two"),
    ("data.shape", "1,x,28"),
    ("data.seed", "0x1f"),
    ("data.val_fraction", "1"),
    ("data.val_fraction", "half"),
]
# A TOML value of the wrong type, per type of key.
WRONG_TOML: dict[type, str] = {
    str: "5",
    Path: "5",
    int: "2.5",
    float: "true",
    tuple: '[1, "x"]',
    bool: "3",
}
KEY_IDS = [key.name for key in KEYS]
SOURCES = ("file", "env", "flag")


def _toml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | Path):
        return json.dumps(str(value))  # a TOML basic string, for these plain values
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return repr(value)


def _text(value: Any) -> str:
    """How a value is written in an environment variable or a flag."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _write(tmp_path: Path, values: dict[str, Any], raw: dict[str, str] | None = None) -> Path:
    """An agent.toml of ``values`` (literals made here) and ``raw`` (literals as given)."""
    lines = {name: _toml_literal(value) for name, value in values.items()} | (raw or {})
    top = [f"{name} = {lit}" for name, lit in lines.items() if "." not in name]
    data = [f"{name[len('data.') :]} = {lit}" for name, lit in lines.items() if "." in name]
    file = tmp_path / "agent.toml"
    file.write_text("\n".join([*top, "[data]", *data]) + "\n")
    return file


def _from_command_line(argv: list[str], *, file: Path, env: dict[str, str]) -> AgentConfig:
    """Parse ``argv`` with the agent's real parser, as ``medsplit-agent`` does."""
    args = cli.parser().parse_args(["check", "--config", str(file), *argv])
    return load_config(file=args.config, flags=config_flags(args), env=env)


def _read(config: AgentConfig, name: str) -> Any:
    """The value of key ``name`` in ``config``."""
    if name == "data.val_fraction":
        return config.val_fraction
    if name.removeprefix("data.") in TEST_KEYS:
        return getattr(config.test, TEST_KEYS[name.removeprefix("data.")])
    if name.startswith("data."):
        return getattr(config.data, name.removeprefix("data."))
    return getattr(config, name)


def _where(key: Key, source: str, file: Path) -> str:
    """How an error names the source of a bad value."""
    if source == "file":
        return f"{file} [data]" if key.section == "data" else str(file)
    return key.env if source == "env" else key.flag


def _load(key: Key, source: str, value: Any, tmp_path: Path) -> AgentConfig:
    """Load the base with ``key`` set to ``value`` (a Python value) from ``source``."""
    if source == "file":
        file = _write(tmp_path, {**BASE, key.name: value})
        return load_config(file=file, flags={}, env={})
    file = _write(tmp_path, BASE)
    if source == "env":
        return load_config(file=file, flags={}, env={key.env: _text(value)})
    return _from_command_line([key.flag, _text(value)], file=file, env={})


def test_every_key_has_samples() -> None:
    assert set(SAMPLES) == {key.name for key in KEYS}
    for key in KEYS:
        first, second = SAMPLES[key.name]
        assert first != key.default and first != second, key.name
        assert BASE.get(key.name) not in (first, second), key.name


def test_names_do_not_collide() -> None:
    for attribute in ("name", "dest", "env", "flag"):
        names = [getattr(key, attribute) for key in KEYS]
        assert len(set(names)) == len(names), attribute


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("key", KEYS, ids=KEY_IDS)
def test_every_key_arrives_typed_from_each_source(key: Key, source: str, tmp_path: Path) -> None:
    expected = SAMPLES[key.name][0]
    config = _load(key, source, expected, tmp_path)
    got = _read(config, key.name)
    assert got == expected and type(got) is type(expected)
    if key.name == "data.seed":
        assert config.split_seed == expected, "the local split follows the data seed"


@pytest.mark.parametrize("key", KEYS, ids=KEY_IDS)
def test_flags_win_over_the_environment_which_wins_over_the_file(key: Key, tmp_path: Path) -> None:
    first, second = SAMPLES[key.name]
    file = _write(tmp_path, {**BASE, key.name: first})
    env = {key.env: _text(second)}
    assert _read(load_config(file=file, flags={}, env=env), key.name) == second
    on_the_command_line = _from_command_line([key.flag, _text(first)], file=file, env=env)
    assert _read(on_the_command_line, key.name) == first


@pytest.mark.parametrize("key", [k for k in KEYS if k.name not in BASE], ids=lambda key: key.name)
def test_a_key_no_one_sets_has_its_documented_default(key: Key, tmp_path: Path) -> None:
    config = load_config(file=_write(tmp_path, BASE), flags={}, env={})
    assert _read(config, key.name) == key.default


def test_the_documented_data_defaults_are_the_data_sources_own() -> None:
    own = {field.name: field.default for field in dataclasses.fields(DataSource)}
    for key in KEYS:
        if key.section == "data" and not key.required and key.field in own:
            assert own[key.field] == key.default, key.name


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize(("name", "bad"), BAD_TEXT)
def test_a_bad_value_names_the_key_and_its_source(
    name: str, bad: str, source: str, tmp_path: Path
) -> None:
    key = next(k for k in KEYS if k.name == name)
    file = tmp_path / "agent.toml"  # where _write puts it
    with pytest.raises(ConfigError) as raised:
        if source == "file":
            load_config(file=_write(tmp_path, BASE, raw={name: json.dumps(bad)}), flags={}, env={})
        else:
            _load(key, source, bad, tmp_path)
    message = str(raised.value)
    assert name in message and _where(key, source, file) in message, message


@pytest.mark.parametrize("key", KEYS, ids=KEY_IDS)
def test_a_value_of_the_wrong_type_in_the_file_names_the_key_and_the_file(
    key: Key, tmp_path: Path
) -> None:
    file = _write(tmp_path, BASE, raw={key.name: WRONG_TOML[key.type]})
    with pytest.raises(ConfigError) as raised:
        load_config(file=file, flags={}, env={})
    assert key.name in str(raised.value) and _where(key, "file", file) in str(raised.value)


@pytest.mark.parametrize("key", [k for k in KEYS if k.required], ids=lambda key: key.name)
@pytest.mark.parametrize("value", [None, ""], ids=["absent", "empty"])
def test_a_required_key_that_is_not_set_says_where_to_set_it(
    key: Key, value: str | None, tmp_path: Path
) -> None:
    base = {name: v for name, v in BASE.items() if name != key.name}
    env = {} if value is None else {key.env: value}
    with pytest.raises(ConfigError, match=rf"^{re.escape(key.name)} is not set") as raised:
        load_config(file=_write(tmp_path, base), flags={}, env=env)
    assert key.env in str(raised.value) and key.flag in str(raised.value)


def test_an_empty_value_unsets_an_optional_key(tmp_path: Path) -> None:
    file = _write(tmp_path, {**BASE, "ca_bundle": "/etc/ssl/ca.pem"})
    config = load_config(file=file, flags={}, env={"MEDSPLIT_AGENT_CA_BUNDLE": ""})
    assert config.ca_bundle is None


@pytest.mark.parametrize("shape", ["[3, 32, 32]", '"3,32,32"'], ids=["list", "text"])
def test_the_shape_in_the_file_is_a_list_or_text(shape: str, tmp_path: Path) -> None:
    file = _write(tmp_path, BASE, raw={"data.shape": shape})
    assert load_config(file=file, flags={}, env={}).data.shape == (3, 32, 32)


def test_unknown_keys_are_refused_with_where_they_are(tmp_path: Path) -> None:
    file = _write(tmp_path, BASE, raw={"coordinater": '"typo"', "data.pth": '"typo"'})
    with pytest.raises(ConfigError, match="unknown configuration keys: coordinater") as raised:
        load_config(file=file, flags={}, env={})
    assert f"data.pth ({file} [data])" in str(raised.value)
    with pytest.raises(ConfigError, match=r"unknown configuration keys: nope \(--nope\)"):
        load_config(file=None, flags={"nope": 1}, env={})


FLAGS = {"coordinator_url": "https://c.example", "work_dir": "/tmp/w", "data_kind": "synthetic"}


def test_flags_override_environment_which_overrides_the_file(tmp_path: Path) -> None:
    file = tmp_path / "agent.toml"
    file.write_text(
        'coordinator_url = "https://from-file.example"\nwork_dir = "/srv/agent"\n'
        'device = "cpu"\n[data]\nkind = "synthetic"\nsamples = 40\nval_fraction = 0.25\n'
    )
    env = {
        "MEDSPLIT_AGENT_COORDINATOR_URL": "https://from-env.example",
        "MEDSPLIT_AGENT_DATA_SAMPLES": "60",
    }
    config = load_config(file=file, flags={"work_dir": "/flag/dir", "device": None}, env=env)
    assert config.coordinator_url == "https://from-env.example"
    assert config.work_dir == Path("/flag/dir")
    assert config.data.kind == "synthetic" and config.data.samples == 60
    assert config.val_fraction == 0.25


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({**FLAGS, "coordinator_url": None}, "coordinator_url is not set"),
        ({**FLAGS, "coordinator_url": "ftp://x"}, "must start with https://"),
        ({**FLAGS, "device": "tpu"}, "device must be one of cpu, cuda"),
        ({**FLAGS, "data_kind": None}, "data.kind is not set"),
        ({**FLAGS, "data_samples": "many"}, "data.samples must be an integer"),
        (
            {**FLAGS, "data_kind": "medmnist", "data_path": "x.npz", "data_task": "segmentation"},
            "a medmnist source holds no masks; a segmentation set is a folder",
        ),
    ],
)
def test_configuration_errors_name_the_key(flags: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(file=None, flags=flags, env={})


def test_the_command_takes_every_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in KEYS:
        monkeypatch.delenv(key.env, raising=False)
    seen: list[AgentConfig] = []
    monkeypatch.setattr(cli, "check", lambda config: seen.append(config) or 0)
    argv = [part for k in KEYS for part in (k.flag, _text(SAMPLES[k.name][0]))]
    assert cli.main(["check", *argv]) == 0
    assert {k.name: _read(seen[0], k.name) for k in KEYS} == {
        name: first for name, (first, _) in SAMPLES.items()
    }


def test_help_groups_the_flags_by_table() -> None:
    text = cli.parser().format_help()
    coordinator, data = text.index("\ncoordinator:\n"), text.index("\ndata:\n")
    for key in KEYS:
        at = text.index(f"  {key.flag} ")
        assert (coordinator < at < data) if key.section == "" else (at > data), key.flag
        assert key.env in " ".join(text[at:].split()), "each flag names its variable"


def _readme_table() -> list[dict[str, str]]:
    """The rows of the README's table of configuration keys, cells without backticks."""
    lines = README.read_text().splitlines()
    header = "| key | environment variable | flag | default | meaning |"
    start = lines.index(header)
    columns = [c.strip() for c in header.strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        rows.append(dict(zip(columns, cells, strict=True)))
    return rows


def test_the_readme_documents_exactly_the_keys() -> None:
    rows = _readme_table()
    assert [row["key"] for row in rows] == [key.name for key in KEYS]
    for row, key in zip(rows, KEYS, strict=True):
        assert (row["environment variable"], row["flag"]) == (key.env, key.flag)
        assert row["default"].replace("—", "") == key.default_text, key.name
        assert row["meaning"], key.name
