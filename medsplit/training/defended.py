"""The job's defenses around a hospital's step role, the same in every path a step runs
(in process, SplitFed, vertical, and the agent's :class:`~medsplit.turns.client.TurnClient`)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from medsplit.defenses.accounting import (
    Spent,
    noise_for_target,
    poisson_rate,
    redraw_probability,
)
from medsplit.defenses.client import ActivationAccount, defend
from medsplit.protocol.party import Party
from medsplit.protocol.roles import ClientRole
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import turn_length

__all__ = ["activation_account", "defended_role", "job_epsilon"]


@lru_cache(maxsize=64)
def _noise(target: float, rate: float, steps: int, delta: float) -> float:
    return noise_for_target(target_epsilon=target, sample_rate=rate, steps=steps, delta=delta)


def activation_account(
    config: TrainingConfig, records: int, *, round_: int
) -> ActivationAccount | None:
    """The activation noise's numbers at a hospital of ``records`` training records, in
    round ``round_`` (``None`` without activation noise): the whole job's steps there are
    ``rounds · turn_length``, the steps before are the earlier rounds'."""
    noise = config.privacy.activation_noise
    if noise is None or records < 1:
        return None
    per_turn = turn_length(config, records)
    job_steps = max(1, config.rounds * per_turn)
    rate = poisson_rate(config.batch_size, records)
    sigma = noise.noise_multiplier
    if sigma is None:
        assert noise.target_epsilon is not None
        sigma = _noise(float(noise.target_epsilon), rate, job_steps, float(noise.delta))
    return ActivationAccount(
        noise_multiplier=float(sigma),
        sample_rate=rate,
        steps_before=round_ * per_turn,
        job_steps=job_steps,
        delta=float(noise.delta),
        redraw=redraw_probability(config.batch_size, records),
    )


def job_epsilon(config: TrainingConfig, records: int) -> Spent | None:
    """ε the whole job spends at a hospital of ``records`` records (``None``: no noise)."""
    account = activation_account(config, records, round_=0)
    if account is None:
        return None
    return account.spent(account.job_steps)


def defended_role(
    role: ClientRole,
    parties: Mapping[str, Party],
    config: TrainingConfig,
    *,
    records: int,
    round_: int,
    classes: int | None,
) -> ClientRole:
    """``role`` with the job's defenses (``role`` itself when none is on)."""
    return defend(
        role,
        parties,
        options=config.privacy,
        seed=config.seed,
        classes=classes,
        account=activation_account(config, records, round_=round_),
    )
