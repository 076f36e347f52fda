"""A malicious server running feature-space hijacking (Pasquini, Ateniese, Bernaschi, CCS
2021), for tests and benches only: never part of the product.

It plays the vanilla server's role in a real :class:`~medsplit.turns.TurnServer`, so its
frames cross the relay as any server's do. It holds an auxiliary share of the same kind
of data and three networks of its own: a pilot encoder from images to the cut's feature
space, a decoder back to images and a discriminator telling the pilot's features from
the hospital's. Each step it trains the pilot and decoder as an autoencoder on its
auxiliary batch, the discriminator on both, and sends the hospital, in place of the
task's gradient, the gradient at the cut of the discriminator's adversarial loss: the
hospital's front is steered into the pilot's space, where the decoder inverts it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from medsplit.channel import Channel, StreamPair
from medsplit.cutting import BoundaryTensor, SplitModel
from medsplit.data import DataSplit
from medsplit.defenses.hijack import HijackDetected
from medsplit.protocol.handoff import export_parties
from medsplit.protocol.roles import (
    LABELS,
    LOSS,
    ServerRole,
    StepIds,
    StepResult,
    boundary_spec,
)
from medsplit.training.config import TrainingConfig
from medsplit.training.schedule import turn_limits
from medsplit.training.setup import client_parties, server_party
from medsplit.turns import (
    ClientReport,
    Directive,
    MemoryCheckpointStore,
    MemorySnapshots,
    ServerOutcome,
    TurnClient,
    TurnIds,
    TurnProgress,
    TurnServer,
)
from medsplit.turns.hijack_guard import HijackGuard
from medsplit.wire import Frame, FrameKind, FrameSpec, TensorSpec


def _conv(cin: int, cout: int, stride: int = 1) -> nn.Module:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.LeakyReLU(0.2))


class FeatureSpaceHijacker(ServerRole):
    """The attacker's server role for a vanilla job cut after a 2x downsampling front.

    Args:
        boundary: the tensors crossing the cut (one image-like ``(C, H, W)`` tensor).
        aux: the attacker's own images ``(N, C, 2H, 2W)`` in [0, 1].
        seed: seeds its networks and its batches.
        lr: its networks' Adam learning rate.
    """

    mode = "vanilla"

    def __init__(
        self, *, boundary: tuple[BoundaryTensor, ...], aux: torch.Tensor, seed: int, lr: float
    ) -> None:
        (cut,) = boundary
        self.boundary, self.name = boundary, cut.name
        channels = cut.shape[0]
        image = aux.shape[1]
        torch.manual_seed(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.aux = aux
        self.pilot = nn.Sequential(
            _conv(image, 32), _conv(32, 32, 2), nn.Conv2d(32, channels, 3, 1, 1)
        )
        self.decoder = nn.Sequential(
            nn.ConvTranspose2d(channels, 32, 4, 2, 1),
            nn.LeakyReLU(0.2),
            _conv(32, 32),
            nn.Conv2d(32, image, 3, 1, 1),
            nn.Sigmoid(),
        )
        self.discriminator = nn.Sequential(
            _conv(channels, 64, 2), _conv(64, 64, 2), nn.Flatten(), nn.LazyLinear(1)
        )
        self.discriminator(torch.zeros(1, *cut.shape))  # materialise the lazy layer
        self.autoencoder_opt = torch.optim.Adam(
            [*self.pilot.parameters(), *self.decoder.parameters()], lr=lr
        )
        self.discriminator_opt = torch.optim.Adam(self.discriminator.parameters(), lr=lr)

    def handle(self, frame: Frame) -> Frame:
        ids = StepIds.of(frame)
        z = frame.tensors[self.name].float()
        pick = torch.randint(len(self.aux), (z.shape[0],), generator=self.generator)
        x_aux = self.aux[pick]
        # The pilot and decoder: an autoencoder on the attacker's own images.
        self.autoencoder_opt.zero_grad()
        F.mse_loss(self.decoder(self.pilot(x_aux)), x_aux).backward()
        self.autoencoder_opt.step()
        # The discriminator: the pilot's features are "real", the hospital's "fake".
        self.discriminator_opt.zero_grad()
        real = self.discriminator(self.pilot(x_aux).detach())
        fake = self.discriminator(z)
        d_loss = F.binary_cross_entropy_with_logits(
            real, torch.ones_like(real)
        ) + F.binary_cross_entropy_with_logits(fake, torch.zeros_like(fake))
        d_loss.backward()
        self.discriminator_opt.step()
        # What the hospital gets: the gradient that makes its features pass for the pilot's.
        leaf = z.detach().requires_grad_(True)
        score = self.discriminator(leaf)
        adversarial = F.binary_cross_entropy_with_logits(score, torch.ones_like(score))
        (grad,) = torch.autograd.grad(adversarial, leaf)
        tensors = {self.name: grad, LOSS: adversarial.detach().float()}
        return Frame(ids.meta(FrameKind.GRADIENTS, self.mode, frame.meta.codec), tensors)

    def reconstruct(self, features: torch.Tensor) -> torch.Tensor:
        """The decoder's images of the hospital's features."""
        with torch.no_grad():
            return self.decoder(features)

    def expect(self) -> FrameSpec:
        specs = boundary_spec(self.boundary)
        specs[LABELS] = TensorSpec((None,), torch.int64)
        return FrameSpec(kind=FrameKind.ACTIVATIONS, tensors=specs)


@dataclass
class HijackRun:
    """How a turn against an honest or hijacking server ended at the hospital."""

    client: TurnClient
    applied: list[int] = field(default_factory=list)  # the steps the hospital applied
    detected: HijackDetected | None = None
    report: ClientReport | None = None
    server_outcome: ServerOutcome | None = None
    #: The front's weights after the last step the hospital applied.
    weights: dict[str, torch.Tensor] = field(default_factory=dict)


class _StopWhenTold:
    """Server hooks that stop the turn once the hospital has left it."""

    def __init__(self) -> None:
        self.stop = threading.Event()

    def directive(self) -> Directive:
        return Directive.STOP if self.stop.is_set() else Directive.RUN

    def progress(self, progress: TurnProgress) -> None:
        pass

    def finish(self, metrics: Mapping[str, float], progress: TurnProgress) -> None:
        pass

    def resumed(self, step: int, reason: str) -> None:
        pass


def run_turn(
    *,
    channel: Channel,
    streams: StreamPair,
    split: SplitModel,
    config: TrainingConfig,
    train: DataSplit,
    attacker: FeatureSpaceHijacker | None = None,
    guard: HijackGuard | None = None,
    timeout: float = 30.0,
) -> HijackRun:
    """One vanilla turn: the hospital's real :class:`TurnClient` (with ``guard``, or the
    job's own) against a real :class:`TurnServer`, honest or playing ``attacker``."""
    ids = TurnIds(config.job, 0, 0, config.mode, config.codec)
    limits = turn_limits(config, num_classes=2, train=len(train), val=0, label_shape=())
    start = export_parties(client_parties(split, config))
    party = server_party(split, config)
    client = TurnClient(
        ids=ids,
        channel=channel,
        streams=streams,
        split=split,
        parties=lambda: client_parties(split, config),
        start=start,
        config=config,
        train=train,
        val=None,
        snapshots=MemorySnapshots(),
        reply_timeout=timeout,
        limits=limits,
        guard=guard,
    )
    run = HijackRun(client)

    def applied(result: StepResult) -> None:
        run.applied.append(result.ids.step)
        front = client.parties["front"].module
        run.weights = {k: v.detach().clone() for k, v in front.state_dict().items()}

    client.on_step = applied
    hooks = _StopWhenTold()
    server = TurnServer(
        ids=ids,
        channel=channel,
        streams=streams,
        split=split,
        party=party,
        store=MemoryCheckpointStore(export_parties({"server": party})),
        hooks=hooks,
        limits=limits,
        loss_fn=config.loss_fn(),
        hospital="h0",
        silence_timeout=timeout,
        poll_interval=0.05,
        role=(lambda: attacker) if attacker is not None else None,
    )

    def serve() -> None:
        run.server_outcome = server.run()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        run.report = client.run()
    except HijackDetected as e:
        run.detected = e
    finally:
        hooks.stop.set()
        thread.join(timeout)
    return run
