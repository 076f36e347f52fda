"""``medsplit-agent status``: what this agent is, read offline from its work directory.

It prints the hospital, the coordinator, this agent's identity fingerprint and those it
pinned for its peers, for people to compare out of band with the dashboard and with the
other hospitals. Each part is one function of :data:`SECTIONS`, returning ``(label,
value)`` lines; a later feature adds its lines by adding a function there.
"""

from __future__ import annotations

from collections.abc import Callable

from hospital_agent.config import AgentConfig
from hospital_agent.identity import has_legacy_key, load_credentials, load_identity
from hospital_agent.job_keys import JobKeys
from hospital_agent.pins import Pins
from hospital_agent.witness import Witness
from medsplit.protocol.keys import fingerprint, format_fingerprint

Line = tuple[str, str]
Section = Callable[[AgentConfig], list[Line]]


def _agent(config: AgentConfig) -> list[Line]:
    credentials = load_credentials(config.work_dir)
    hospital = credentials.hospital if credentials else "(not enrolled yet)"
    return [
        ("hospital", hospital),
        ("coordinator", config.coordinator_url),
        ("work dir", str(config.work_dir)),
    ]


def _identity(config: AgentConfig) -> list[Line]:
    identity = load_identity(config.work_dir)
    if identity is None:
        return [("identity", "none yet: the agent makes its identity key on its first run")]
    credentials = load_credentials(config.work_dir)
    generation = credentials.identity_generation if credentials else 0
    state = (
        f"ML-DSA-65, generation {generation}"
        if generation
        else "ML-DSA-65, not yet acknowledged by the coordinator (at the next run)"
    )
    lines = [("identity", state), ("fingerprint", format_fingerprint(fingerprint(identity)))]
    if has_legacy_key(config.work_dir):
        lines.append(("legacy key", "agent.key (X25519): deleted once the agent has moved"))
    return lines


def _peers(config: AgentConfig) -> list[Line]:
    pins = Pins(config.work_dir).all()
    if not pins:
        return [("peers", "none pinned yet (pinned at the first job with them)")]
    return [
        (
            f"peer {pin.hospital}",
            f"{format_fingerprint(pin.fingerprint)} (generation {pin.generation}, "
            f"pinned {pin.pinned_at})",
        )
        for pin in pins.values()
    ]


def _job_keys(config: AgentConfig) -> list[Line]:
    held = JobKeys(config.work_dir).held()
    text = ", ".join(f"job-{job}" for job in held) if held else "none"
    return [("per-job keys", text)]


def _audit_chain(config: AgentConfig) -> list[Line]:
    result = Witness(config.work_dir).last_result()
    if result is None:
        return [("audit chain", "not checked yet (every few heartbeats)")]
    head = result.get("head", {})
    if result.get("ok"):
        return [
            (
                "audit chain",
                f"ok: every head this hospital was shown is still in the chain (checked "
                f"{result.get('checked_at')}, head {head.get('seq')})",
            )
        ]
    mismatch = result.get("mismatch", {})
    return [("audit chain", f"CHANGED behind this hospital: {mismatch.get('message')}")]


SECTIONS: tuple[Section, ...] = (_agent, _identity, _peers, _job_keys, _audit_chain)
"""The parts of ``medsplit-agent status``, in order; add a function to add lines."""


def status_lines(config: AgentConfig) -> list[Line]:
    """Every line of every section.

    Raises:
        ConfigError: a file of the work directory is damaged or others may read it.
    """
    return [line for section in SECTIONS for line in section(config)]


def render(lines: list[Line]) -> str:
    width = max(len(label) for label, _ in lines)
    return "\n".join(f"{label + ':':<{width + 1}}  {value}" for label, value in lines)
