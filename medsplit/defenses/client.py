"""A hospital's step role with its defenses: any mode's client role, wrapped.

:class:`DefendedClient` leaves the mode's role as it is and acts around it:

- activation noise and NoPeek: a forward hook on the front segment, active only while
  a training step starts (validation goes through the mode's own ``eval_activations``,
  which the hook lets pass: see docs/security.md), replaces the front's outputs by
  ``clip_and_noise(nopeek(A))``; the front's backward then runs through the clipping,
  and NoPeek's term adds its gradient (:mod:`medsplit.defenses.nopeek`);
- label noise: randomised response on the labels before the role sends them;
- gradient noise: on the ``head_gradients`` frame the role sends up (U-shaped, and a
  vertical job's label party).

Every draw is seeded from the job's seed and the step (:func:`defense_seed`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from medsplit.defenses.accounting import Spent, epsilon_spent
from medsplit.defenses.mechanisms import (
    clip_and_noise,
    defense_generator,
    gradient_noise,
    randomised_response,
)
from medsplit.defenses.nopeek import nopeek_outputs
from medsplit.defenses.options import PrivacyOptions
from medsplit.errors import ConfigError
from medsplit.protocol.party import Party
from medsplit.protocol.roles import ClientRole, StepIds, StepResult
from medsplit.wire import Frame, FrameKind, FrameSpec

__all__ = ["ActivationAccount", "DefendedClient", "defend"]


@dataclass(frozen=True)
class ActivationAccount:
    """What a hospital's activation noise is and spends: the noise multiplier in use
    (from ``noise_multiplier``, or found from ``target_epsilon``), the sampling rate,
    the steps before this turn (earlier rounds) and the job's steps at this hospital."""

    noise_multiplier: float
    sample_rate: float
    steps_before: int
    job_steps: int
    delta: float
    redraw: float = 0.0

    def spent(self, steps_this_turn: int) -> Spent:
        return epsilon_spent(
            noise_multiplier=self.noise_multiplier,
            sample_rate=self.sample_rate,
            steps=self.steps_before + steps_this_turn,
            delta=self.delta,
            redraw=self.redraw,
        )


class DefendedClient(ClientRole):
    """``inner`` with the job's defenses (see the module docstring).

    Args:
        inner: the mode's client role over ``parties``.
        parties: the hospital's parties; ``front`` is the one whose outputs cross.
        options: the job's privacy options.
        seed: the job's seed.
        classes: the classes labels fall in (label noise).
        account: the activation noise's numbers (required with activation noise).
    """

    def __init__(
        self,
        inner: ClientRole,
        parties: Mapping[str, Party],
        *,
        options: PrivacyOptions,
        seed: int,
        classes: int | None = None,
        account: ActivationAccount | None = None,
    ) -> None:
        self.inner = inner
        self.mode = inner.mode
        self.options = options
        self.seed = seed
        self.classes = classes
        self.account = account
        if options.activation_noise and account is None:
            raise ConfigError("activation noise needs its account (noise, rate, steps)")
        if options.label_noise and (classes is None or classes < 2):
            raise ConfigError(f"label_noise needs the job's classes (at least 2), got {classes!r}")
        self._ids: StepIds | None = None
        self._x: torch.Tensor | None = None
        self.steps_done = 0
        self._hook = None
        if options.activation_noise or options.nopeek:
            if "front" not in parties:
                raise ConfigError("activation noise and NoPeek need the hospital's front")
            self._hook = parties["front"].module.register_forward_hook(self._on_front)

    # -- the hook -----------------------------------------------------------------------

    def _on_front(self, module: torch.nn.Module, args: tuple, output: object) -> object:
        if self._ids is None or not isinstance(output, Mapping):
            return None  # validation, or a forward outside a step: as it is
        ids, x = self._ids, args[0] if args else self._x
        out = dict(output)
        if self.options.nopeek and x is not None and torch.is_grad_enabled():
            out = nopeek_outputs(x, out, self.options.nopeek.weight)
        noise = self.options.activation_noise
        if noise is not None:
            assert self.account is not None
            floats = {n: t for n, t in out.items() if t.is_floating_point()}
            device = next(iter(floats.values())).device if floats else "cpu"
            generator = defense_generator(
                self.seed, ids.round, ids.position, ids.step, "activations", device
            )
            out.update(
                clip_and_noise(
                    floats,
                    clip_norm=noise.clip_norm,
                    noise_multiplier=self.account.noise_multiplier,
                    generator=generator,
                )
            )
        return out

    # -- the role -----------------------------------------------------------------------

    def start(self, ids: StepIds, x: torch.Tensor, y: torch.Tensor | None = None) -> Frame:
        if self.options.label_noise and y is not None:
            assert self.classes is not None
            generator = defense_generator(self.seed, ids.round, ids.position, ids.step, "labels")
            y = randomised_response(
                y,
                classes=self.classes,
                epsilon=self.options.label_noise.epsilon,
                generator=generator,
            )
        self._ids, self._x = ids, x
        try:
            return self.inner.start(ids, x, y)  # type: ignore[arg-type]
        finally:
            self._ids, self._x = None, None

    def receive(self, frame: Frame) -> Frame | StepResult:
        result = self.inner.receive(frame)
        if isinstance(result, Frame):
            if result.meta.kind == FrameKind.HEAD_GRADIENTS and self.options.gradient_noise:
                m = result.meta
                generator = defense_generator(self.seed, m.round, m.position, m.step, "gradients")
                tensors = gradient_noise(
                    result.tensors, scale=self.options.gradient_noise.scale, generator=generator
                )
                return Frame(result.meta, tensors)
            return result
        self.steps_done += 1
        return result

    def expect(self) -> FrameSpec:
        return self.inner.expect()

    def __getattr__(self, name: str) -> object:
        # What a mode's role exposes beyond the interface (a vertical passive party's
        # last gradient, ``received``) reads through.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def spent(self) -> Spent | None:
        """ε spent at this hospital so far: earlier rounds and this turn's finished steps
        (``None`` without activation noise)."""
        if self.account is None:
            return None
        return self.account.spent(self.steps_done)

    def close(self) -> None:
        """Take the hook off the front (a role not used again)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


def defend(
    inner: ClientRole,
    parties: Mapping[str, Party],
    *,
    options: PrivacyOptions,
    seed: int,
    classes: int | None = None,
    account: ActivationAccount | None = None,
) -> ClientRole:
    """``inner`` itself when no defense is on (exactness untouched), else wrapped."""
    if not (
        options.activation_noise or options.nopeek or options.label_noise or options.gradient_noise
    ):
        return inner
    return DefendedClient(
        inner, parties, options=options, seed=seed, classes=classes, account=account
    )
