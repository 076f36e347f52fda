"""ε of the activation noise over a whole job, at one hospital (opacus' RDP accountant).

Each training step of a hospital with activation noise is the Poisson-subsampled
Gaussian mechanism on its training split: every record is in the step's batch with
probability ``q = batch_size / N`` (:func:`poisson_rate`), each sample's activations are
clipped to ``clip_norm`` and get Gaussian noise of standard deviation
``noise_multiplier * clip_norm``. Composed over the hospital's steps of the whole job,
opacus' RDP accountant turns it into (ε, δ). Both sides compute the same numbers from
the job (N, the batch size, the steps) so that what a hospital reports can be checked.

A draw that comes out empty, or above :func:`poisson_bound`, is drawn again (the step
must have records, and the frame limits a size); this conditions the sampling on an
event of probability at most :func:`redraw_probability` per step, so the guarantee is
(ε, δ + steps · (1 + e^ε) · p): :class:`Spent` says so in ``delta_total``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from medsplit.errors import ConfigError

__all__ = [
    "REDRAW_TAIL",
    "Spent",
    "epsilon_spent",
    "largest_poisson_batch",
    "noise_for_target",
    "poisson_bound",
    "poisson_rate",
    "redraw_probability",
]

#: The chance above which the Poisson bound sits (per step): P(|batch| > bound) ≤ this.
REDRAW_TAIL = 1e-9


def poisson_rate(batch_size: int, records: int) -> float:
    """The chance each record is in a step's batch: ``batch_size / records``, at most 1."""
    if records < 1 or batch_size < 1:
        raise ConfigError(
            f"Poisson sampling needs records and a batch, got {records}, {batch_size}"
        )
    return min(1.0, batch_size / records)


@lru_cache(maxsize=256)
def largest_poisson_batch(batch_size: int) -> int:
    """A bound on :func:`poisson_bound` for any number of records: the Poisson(batch_size)
    tail's (a binomial of the same mean has a lighter tail), for limits set before the
    hospitals' sizes are known (the relay's)."""
    from scipy.stats import poisson  # heavy: only a job with noise needs it

    k = int(poisson.isf(REDRAW_TAIL, batch_size))
    while poisson.sf(k, batch_size) > REDRAW_TAIL:
        k += 1
    return max(batch_size, k)


@lru_cache(maxsize=256)
def poisson_bound(batch_size: int, records: int) -> int:
    """The largest batch a Poisson draw may give: the smallest ``k`` with
    ``P(Binomial(records, q) > k) <= REDRAW_TAIL``, never below ``batch_size``."""
    from scipy.stats import binom

    q = poisson_rate(batch_size, records)
    k = int(binom.isf(REDRAW_TAIL, records, q))
    while k < records and binom.sf(k, records, q) > REDRAW_TAIL:
        k += 1
    return max(batch_size, min(records, k, largest_poisson_batch(batch_size)))


def redraw_probability(batch_size: int, records: int) -> float:
    """The chance a step's draw is empty or above :func:`poisson_bound` (drawn again)."""
    from scipy.stats import binom

    q = poisson_rate(batch_size, records)
    return float((1 - q) ** records + binom.sf(poisson_bound(batch_size, records), records, q))


@dataclass(frozen=True)
class Spent:
    """What the activation noise spent at one hospital.

    Attributes:
        epsilon: ε over the steps so far, at ``delta`` (opacus' RDP accountant).
        delta: the job's δ.
        delta_total: δ with the redraws' share added (see the module docstring).
        steps: the steps accounted.
        sample_rate: q.
        noise_multiplier: σ.
    """

    epsilon: float
    delta: float
    delta_total: float
    steps: int
    sample_rate: float
    noise_multiplier: float

    def to_json(self) -> dict[str, float | int]:
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "delta_total": self.delta_total,
            "steps": self.steps,
            "sample_rate": self.sample_rate,
            "noise_multiplier": self.noise_multiplier,
        }


def epsilon_spent(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    redraw: float = 0.0,
) -> Spent:
    """ε after ``steps`` Poisson-subsampled Gaussian steps at rate ``sample_rate`` and
    noise ``noise_multiplier``, at ``delta`` (0 steps: ε = 0); ``redraw``: the chance per
    step that a draw is drawn again (:func:`redraw_probability`)."""
    if steps < 0 or not 0 < sample_rate <= 1 or noise_multiplier <= 0 or not 0 < delta < 1:
        raise ConfigError(
            f"cannot account steps={steps}, q={sample_rate}, sigma={noise_multiplier}, "
            f"delta={delta}"
        )
    if steps == 0:
        return Spent(0.0, delta, delta, 0, sample_rate, noise_multiplier)
    from opacus.accountants import RDPAccountant  # heavy: only a job with noise needs it

    accountant = RDPAccountant()
    accountant.history = [(noise_multiplier, sample_rate, steps)]
    epsilon = float(accountant.get_epsilon(delta=delta))
    extra = steps * (1 + math.exp(min(epsilon, 700.0))) * redraw
    return Spent(epsilon, delta, delta + extra, steps, sample_rate, noise_multiplier)


def noise_for_target(
    *, target_epsilon: float, sample_rate: float, steps: int, delta: float
) -> float:
    """The smallest noise multiplier (to opacus' tolerance, from above) whose ε after
    ``steps`` steps at ``sample_rate`` is at most ``target_epsilon`` at ``delta``."""
    if steps < 1:
        raise ConfigError(f"a target ε needs at least one step, got {steps}")
    from opacus.accountants.utils import get_noise_multiplier

    sigma = float(
        get_noise_multiplier(
            target_epsilon=target_epsilon,
            target_delta=delta,
            sample_rate=sample_rate,
            steps=steps,
            accountant="rdp",
        )
    )
    # opacus stops within its tolerance, from above; make sure of it here.
    while (
        epsilon_spent(
            noise_multiplier=sigma, sample_rate=sample_rate, steps=steps, delta=delta
        ).epsilon
        > target_epsilon
    ):
        sigma *= 1.01
    return sigma
