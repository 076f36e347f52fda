"""A vertical evaluation over a channel, every party's side and the server's in threads:
the core test's and the hostile parties' set-up."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from medsplit.channel import Channel, RelayKeys
from medsplit.models import build_model
from medsplit.protocol.party import Party
from medsplit.training.config import TrainingConfig
from medsplit.training.vertical_model import (
    VerticalModel,
    build_vertical,
    image_parts,
    same_model_parts,
    vertical_parties,
)
from medsplit.turns.control import TurnIds
from medsplit.turns.vertical_eval import (
    VerticalEvalServed,
    VerticalEvalServer,
    evaluate_vertical_party,
    serve_vertical_evaluation,
)

PARTIES = ("h1", "h2")
N = 37  # three batches of 16, the last one short
KEYS = RelayKeys()
DIGEST = hashlib.sha256(b"the aligned test records").hexdigest()


def vertical_setup(labels: str, join: str = "sum") -> tuple[VerticalModel, dict, TrainingConfig]:
    """A trained-looking vertical small_cnn (random weights) and every party's copy."""
    cuts = ("pool1", "pool") if labels == "hospital" else ("pool1",)
    config = TrainingConfig(
        cuts=cuts, mode="vertical", mode_options={"join": join, "labels": labels}, batch_size=16
    )
    model = build_vertical(
        same_model_parts(
            build_model("small_cnn", seed=0), torch.zeros(2, 1, 28, 28), cuts, PARTIES
        ),
        mode=config.split_mode,  # type: ignore[arg-type]
        label_party="h1",
        seed=0,
    )
    return model, vertical_parties(model, config), config


def aligned_test_records(seed: int = 3) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(N, 1, 28, 28, generator=generator)
    y = torch.randint(0, 2, (N,), generator=generator)
    return dict(zip(PARTIES, image_parts(x, len(PARTIES)), strict=True)), y


@dataclass
class Run:
    served: VerticalEvalServed | None = None
    server: VerticalEvalServer | None = None
    outcomes: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, BaseException] = field(default_factory=dict)


def run_evaluation(
    channel: Channel,
    model: VerticalModel,
    parties: Mapping[str, Mapping[str, Party]],
    features: Mapping[str, torch.Tensor],
    labels: torch.Tensor,
    *,
    labels_at_server: bool,
    job: str = "job-1",
    party: Callable[..., Any] = evaluate_vertical_party,
    hostile: str | None = None,
    timeout: float = 20.0,
    predict: bool = False,
) -> Run:
    """Serve one evaluation (a prediction with ``predict``: no labels sent); ``party``
    replaces the honest side of ``hostile``."""
    ids = {p: TurnIds(job, 7, i, "vertical") for i, p in enumerate(PARTIES)}
    streams = {p: KEYS.streams(job, p) for p in PARTIES}
    server = VerticalEvalServer(
        top=parties["server"]["top"],
        inputs=model.inputs,
        top_input=model.top_input,
        head_boundary=model.head_boundary,
        label_party="h1",
        join=model.join,
        batch_size=16,
        max_records={p: N for p in PARTIES},
        num_classes=2,
        predict=predict,
    )
    run = Run(server=server)

    def side(p: str) -> None:
        try:
            own = parties[p]
            run.outcomes[p] = (party if p == hostile else evaluate_vertical_party)(
                channel=channel,
                streams=streams[p],
                ids=ids[p],
                front=own["front"],
                boundary=model.inputs[p],
                features=features[p],
                digest=DIGEST,
                batch_size=16,
                head=own.get("head"),
                head_boundary=model.head_boundary,
                labels=labels if p == "h1" and not predict else None,
                labels_at_server=labels_at_server,
                train_labels=labels if p == "h1" and not predict else None,
                reply_timeout=timeout,
                predict=predict,
                label_party=p == "h1",
                num_classes=2,
            )
        except BaseException as e:
            run.errors[p] = e

    threads = [threading.Thread(target=side, args=(p,), daemon=True) for p in PARTIES]
    for t in threads:
        t.start()
    run.served = serve_vertical_evaluation(
        channel=channel, streams=streams, ids=ids, server=server, silence_timeout=timeout, poll=0.1
    )
    for t in threads:
        t.join(timeout)
    return run


def snapshot(parties: Mapping[str, Mapping[str, Party]]) -> dict[str, torch.Tensor]:
    return {
        f"{who}.{seg}.{k}": v.clone()
        for who, segs in parties.items()
        for seg, party in segs.items()
        for k, v in party.module.state_dict().items()
    }


def unsplit_logits(model: VerticalModel, parties, features: Mapping[str, torch.Tensor]):
    """The whole model's forward over the same test batches, in one process."""
    from medsplit.training.vertical_model import assemble

    whole = assemble(model, parties).eval()
    with torch.no_grad():
        return torch.cat(
            [whole({p: f[i : i + 16] for p, f in features.items()}) for i in range(0, N, 16)]
        )
