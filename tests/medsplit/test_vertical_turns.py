"""A vertical round as the platform runs it: one TurnServer per party on one joint step,
one TurnClient per party, in threads over a channel; exact against unsplit training."""

from __future__ import annotations

import copy
import functools
import threading

import pytest
import torch

from medsplit.channel import InMemoryChannel
from medsplit.errors import ConfigError
from medsplit.protocol.handoff import export_parties, import_parties
from medsplit.protocol.party import Party
from medsplit.training.config import TrainingConfig
from medsplit.training.description import JobDescription
from medsplit.training.schedule import turn_limits
from medsplit.training.setup import JobModel
from medsplit.training.vertical_job import VerticalParty, align_parties
from medsplit.training.vertical_model import image_parts, train_vertical_unsplit
from medsplit.training.vertical_parts import (
    aligned_split,
    job_vertical_model,
    party_batches,
    party_parties,
    party_role,
)
from medsplit.turns import (
    ClientOutcome,
    MemorySnapshots,
    ServerOutcome,
    TurnClient,
    TurnIds,
    TurnServer,
)
from medsplit.turns.joint import JointPartyRole, JointStep
from medsplit.turns.shared import SharedStart
from tests.medsplit.turn_harness import ScriptedHooks
from tests.redis_server import session_keys

PARTIES = ("label-site", "imaging-site")
N = 80


def _config(labels: str) -> TrainingConfig:
    return TrainingConfig(
        cuts=("pool1", "pool") if labels == "hospital" else ("pool1",),
        mode="vertical",
        mode_options={"join": "mean", "labels": labels},
        batch_size=16,
        rounds=2,
        seed=11,
        job="job-42",
    )


def _records() -> list[VerticalParty]:
    generator = torch.Generator().manual_seed(3)
    x = torch.rand(N, 1, 28, 28, generator=generator)
    y = torch.randint(0, 2, (N,), generator=generator)
    ids = [f"pt-{i:03d}" for i in range(N)]
    a, b = image_parts(x, 2)
    # The second site holds 70 of the records, in its own order.
    keep = list(range(N - 10))[::-1]
    return [
        VerticalParty(PARTIES[0], tuple(ids), a, y),
        VerticalParty(PARTIES[1], tuple(ids[i] for i in keep), b[keep]),
    ]


@pytest.mark.parametrize("labels", ["hospital", "server"])
def test_a_vertical_job_over_turns_equals_the_unsplit_model(labels: str) -> None:
    config = _config(labels)
    job_model = JobModel("small_cnn", 2, 1, 2, (1, 28, 28), seed=0)
    model = job_vertical_model(job_model, config, PARTIES)
    records = _records()
    alignment = align_parties(
        records, label_party=PARTIES[0], job=config.job, seed=config.seed, minimum=10
    )
    data = {}
    for r in records:
        rows = torch.tensor(alignment.positions(r.identifiers, source=r.name))
        data[r.name] = aligned_split(r.features[rows], None if r.labels is None else r.labels[rows])
    limits = _limits(config, alignment)
    channel = InMemoryChannel()
    states = {p: export_parties(party_parties(model, config, p)) for p in PARTIES}
    top = Party.create(copy.deepcopy(model.top), config.server_optimizer)
    top_state = export_parties({"server": top})
    for round_ in range(config.rounds):
        server = config.split_mode.joint_server_role(  # type: ignore[attr-defined]
            top,
            inputs=model.inputs,
            top_input=model.top_input,
            head_boundary=model.head_boundary,
            label_party=model.label_party,
            job=config.job,
            codec=config.codec,
            limits=limits,
        )
        import_parties(top_state, {"server": top})
        joint = JointStep(server, steps=limits.train_steps or 0, wait=0.05)
        clients = _run_round(
            joint, config, model, alignment, data, states, top, top_state, round_, channel
        )
        assert joint.trained and joint.done == limits.train_steps
        states = {p: c.state() for p, c in clients.items()}
        top_state = export_parties({"server": top})

    # The unsplit multi-input model on the same aligned batches.
    def batches():
        for round_ in range(config.rounds):
            per_party = {
                p: party_batches(config, alignment, data[p], round_=round_, position=0)
                for p in PARTIES
            }
            for steps in zip(*per_party.values(), strict=True):
                yield {p: b.x for p, b in zip(PARTIES, steps, strict=True)}, steps[0].y

    reference = train_vertical_unsplit(model, batches(), config).state_dict()
    got = {}
    for party in PARTIES:
        parties = party_parties(model, config, party)
        import_parties(states[party], parties)
        got.update(
            {f"fronts.{party}.{k}": v for k, v in parties["front"].module.state_dict().items()}
        )
        if "head" in parties:
            got.update({f"head.{k}": v for k, v in parties["head"].module.state_dict().items()})
    got.update({f"top.{k}": v for k, v in top.module.state_dict().items()})
    assert got.keys() == reference.keys()
    assert all(torch.equal(got[k], reference[k]) for k in reference)


def _limits(config: TrainingConfig, alignment) -> object:
    return turn_limits(config, num_classes=2, train=len(alignment), val=0)


def _run_round(joint, config, model, alignment, data, states, top, top_state, round_, channel):
    """One round: a TurnServer on the joint step and a TurnClient per party, in threads."""
    limits = _limits(config, alignment)
    outcomes: dict[str, object] = {}
    clients: dict[str, TurnClient] = {}
    threads = []
    for position, party in enumerate(PARTIES):
        ids = TurnIds(config.job, round_, position, config.mode, config.codec)
        streams = session_keys().streams(config.job, party)
        server = TurnServer(
            ids=ids,
            channel=channel,
            streams=streams,
            split=None,  # type: ignore[arg-type]
            party=top,
            store=SharedStart(top_state),
            hooks=ScriptedHooks(),
            limits=limits,
            hospital=party,
            silence_timeout=30,
            poll_interval=0.05,
            gate=joint,
            mode=config.split_mode,
            role=functools.partial(
                JointPartyRole, joint, party=party, job=config.job, mode=config.mode
            ),
        )
        clients[party] = TurnClient(
            ids=ids,
            channel=channel,
            streams=streams,
            split=None,  # type: ignore[arg-type]
            parties=functools.partial(party_parties, model, config, party),
            start=states[party],
            config=config,
            train=data[party],
            val=None,
            snapshots=MemorySnapshots(),
            reply_timeout=30,
            limits=limits,
            role=functools.partial(party_role, model, config, party),
            batches=functools.partial(_batches, config, alignment, data[party], position=position),
        )
        threads.append(
            threading.Thread(target=_keep, args=(outcomes, f"s-{party}", server.run), daemon=True)
        )
        client = clients[party]
        threads.append(
            threading.Thread(target=_keep, args=(outcomes, f"c-{party}", client.run), daemon=True)
        )
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    done = {ServerOutcome.COMPLETED, ClientOutcome.COMPLETED}
    assert all(getattr(o, "outcome", o) in done for o in outcomes.values()), outcomes
    return clients


def _keep(outcomes: dict, name: str, run) -> None:
    outcomes[name] = run()


def _batches(config, alignment, data, round_: int, *, position: int):
    return party_batches(config, alignment, data, round_=round_, position=position)


def test_a_party_named_in_party_models_runs_a_front_of_its_own() -> None:
    """The lab (the label party) runs the job's table model, the imaging site its own CNN;
    naming the label party, or a stranger, is refused before anything is built."""
    described = JobDescription.from_json(
        {
            "version": 3,
            "model": "tabular_mlp",
            "spatial_dims": 2,
            "in_channels": 12,
            "num_classes": 2,
            "input_shape": [12],
            "mode": "vertical",
            "mode_options": {"join": "sum", "labels": "hospital"},
            "cuts": ["block1", "block3"],
            "party_models": {
                "imaging": {"model": "small_cnn", "input_shape": [1, 28, 28], "cut": "flatten"}
            },
        }
    )
    config, fronts = described.training_config("job-1"), described.party_fronts()
    model = job_vertical_model(described.job_model(), config, ("lab", "imaging"), fronts)
    rows, images = torch.zeros(3, 12), torch.zeros(3, 1, 28, 28)
    assert model.fronts["lab"](rows)[model.inputs["lab"].name].shape == (3, 64)
    assert model.fronts["imaging"](images)[model.inputs["imaging"].name].shape == (3, 64)
    assert any(isinstance(m, torch.nn.Conv2d) for m in model.fronts["imaging"].modules())
    with pytest.raises(ConfigError, match=r"name \['imaging'\], which are not among"):
        job_vertical_model(described.job_model(), config, ("imaging", "lab"), fronts)
