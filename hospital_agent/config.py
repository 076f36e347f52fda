"""The agent's configuration: a TOML file, then environment variables, then flags.

Example ``agent.toml``::

    coordinator_url = "https://coordinator.example.org"
    work_dir = "/var/lib/medsplit-agent"
    enrolment_code = "msc_..."        # first run only; the agent keeps its token afterwards
    device = "cpu"                    # or "cuda"
    # ca_bundle = "/etc/ssl/certs/consortium-ca.pem"

    [data]
    kind = "folder"                   # "medmnist", "folder" or "synthetic"
    path = "/data/chest-xrays"
    labels_csv = "labels.csv"         # folder: columns file,label
    val_fraction = 0.2

Every key has an environment variable ``MEDSPLIT_AGENT_<KEY>`` (data keys
``MEDSPLIT_AGENT_DATA_<KEY>``) and a flag ``--<key>`` (``--data-<key>``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hospital_agent.data import DEFAULT_VAL_FRACTION, DataSource
from medsplit.errors import ConfigError

ENV_PREFIX = "MEDSPLIT_AGENT_"
DEVICES = ("cpu", "cuda")
_TOP_KEYS = {
    "coordinator_url": str,
    "work_dir": str,
    "enrolment_code": str,
    "device": str,
    "ca_bundle": str,
    "heartbeat_seconds": float,
    "poll_seconds": float,
    "reply_timeout": float,
}
_DATA_KEYS = {
    "kind": str,
    "path": str,
    "split": str,
    "labels_csv": str,
    "samples": int,
    "num_classes": int,
    "shape": str,
    "seed": int,
    "val_fraction": float,
}


@dataclass(frozen=True)
class AgentConfig:
    """Everything the agent is told; see the module docstring for where it comes from."""

    coordinator_url: str
    work_dir: Path
    data: DataSource
    val_fraction: float = DEFAULT_VAL_FRACTION
    split_seed: int = 0
    enrolment_code: str | None = None
    device: str = "cpu"
    ca_bundle: str | None = None
    heartbeat_seconds: float = 30.0
    poll_seconds: float = 25.0
    reply_timeout: float = 600.0


def load_config(
    *, file: str | os.PathLike[str] | None, flags: Mapping[str, Any], env: Mapping[str, str]
) -> AgentConfig:
    """Merge the TOML ``file``, ``env`` (``MEDSPLIT_AGENT_*``) and ``flags`` (non-None
    values win), check every value, and return the configuration.

    Raises:
        ConfigError: naming the key that is missing or wrong, and where it came from.
    """
    top: dict[str, tuple[Any, str]] = {}
    data: dict[str, tuple[Any, str]] = {}
    if file is not None:
        path = Path(file)
        try:
            parsed = tomllib.loads(path.read_text())
        except OSError as e:
            raise ConfigError(f"cannot read the configuration file {path}: {e}") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path} is not valid TOML: {e}") from e
        for key, value in parsed.items():
            if key == "data" and isinstance(value, dict):
                data.update({k: (v, f"{path} [data]") for k, v in value.items()})
            else:
                top[key] = (value, str(path))
    for key in _TOP_KEYS:
        if (value := env.get(ENV_PREFIX + key.upper())) is not None:
            top[key] = (value, ENV_PREFIX + key.upper())
    for key in _DATA_KEYS:
        name = f"{ENV_PREFIX}DATA_{key.upper()}"
        if (value := env.get(name)) is not None:
            data[key] = (value, name)
    for key, value in flags.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if key.startswith("data_"):
            data[key.removeprefix("data_")] = (value, flag)
        else:
            top[key] = (value, flag)

    unknown = sorted(set(top) - set(_TOP_KEYS)) + [
        f"data.{k}" for k in sorted(set(data) - set(_DATA_KEYS))
    ]
    if unknown:
        raise ConfigError(f"unknown configuration keys: {', '.join(unknown)}")
    values = {key: _typed(key, *top[key], _TOP_KEYS[key]) for key in top}
    data_values = {key: _typed(f"data.{key}", *data[key], _DATA_KEYS[key]) for key in data}

    for required in ("coordinator_url", "work_dir"):
        if not values.get(required):
            raise ConfigError(
                f"{required} is not set: give it in the file, as "
                f"{ENV_PREFIX}{required.upper()} or as --{required.replace('_', '-')}"
            )
    url = values["coordinator_url"].rstrip("/")
    if not url.startswith(("https://", "http://")):
        raise ConfigError(
            f"coordinator_url must start with https:// (or http:// on a test bench), got {url!r}"
        )
    device = values.get("device", "cpu")
    if device not in DEVICES:
        raise ConfigError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    val_fraction = data_values.pop("val_fraction", DEFAULT_VAL_FRACTION)
    if not 0 <= val_fraction < 1:
        raise ConfigError(f"data.val_fraction must be in [0, 1), got {val_fraction}")
    split_seed = data_values.get("seed", 0)
    if "shape" in data_values:
        data_values["shape"] = _shape(data_values["shape"])
    if "kind" not in data_values:
        raise ConfigError(
            "data.kind is not set: medmnist, folder or synthetic "
            f"({ENV_PREFIX}DATA_KIND, --data-kind)"
        )
    source = DataSource(**data_values)
    return AgentConfig(
        coordinator_url=url,
        work_dir=Path(values["work_dir"]).expanduser(),
        data=source,
        val_fraction=val_fraction,
        split_seed=split_seed,
        enrolment_code=values.get("enrolment_code") or None,
        device=device,
        ca_bundle=values.get("ca_bundle") or None,
        heartbeat_seconds=values.get("heartbeat_seconds", 30.0),
        poll_seconds=values.get("poll_seconds", 25.0),
        reply_timeout=values.get("reply_timeout", 600.0),
    )


def _typed(key: str, value: Any, where: str, kind: type) -> Any:
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be text, got {value!r} ({where})")
        return value
    try:
        if isinstance(value, bool):
            raise ValueError
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be a {kind.__name__}, got {value!r} ({where})") from None


def _shape(value: str | list) -> tuple[int, ...]:
    parts = value.split(",") if isinstance(value, str) else value
    try:
        return tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        raise ConfigError(f"data.shape must be like 1,28,28, got {value!r}") from None
