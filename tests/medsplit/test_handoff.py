"""Hand-off of a hospital's training state: exact, pickle-free, all or nothing."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
import torch
from safetensors.torch import save as save_safetensors
from torch import nn

from medsplit.errors import HandoffError
from medsplit.protocol.handoff import export_parties, import_parties, read_safetensors_metadata
from medsplit.protocol.optim import OptimizerConfig
from medsplit.protocol.party import Party

MOMENTUM = OptimizerConfig(name="sgd", lr=0.1, momentum=0.9, schedule="step", step_size=2)
ADAM = OptimizerConfig(name="adam", lr=0.01, schedule="exponential", gamma=0.9)


def net(width: int = 4) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, 2))


def train(party: Party, steps: int, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 3, generator=gen)
        party.module(x).square().mean().backward()
        party.step()


def snapshot(party: Party) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in party.module.state_dict().items()}


@pytest.mark.parametrize("config", [MOMENTUM, ADAM], ids=["sgd-momentum", "adam"])
def test_training_continues_exactly_after_a_hand_off(config: OptimizerConfig) -> None:
    straight = Party.create(net(), config)
    train(straight, 3)
    blob = export_parties({"front": straight})
    train(straight, 3, seed=1)

    receiver = Party.create(copy.deepcopy(net()), config)
    import_parties(blob, {"front": receiver})
    train(receiver, 3, seed=1)

    for name, want in straight.module.state_dict().items():
        assert torch.equal(receiver.module.state_dict()[name], want), name
    assert receiver.optimizer.param_groups[0]["lr"] == straight.optimizer.param_groups[0]["lr"]
    assert receiver.scheduler is not None and straight.scheduler is not None
    assert receiver.scheduler.last_epoch == straight.scheduler.last_epoch == 6


def test_hand_off_is_plain_safetensors_with_json_metadata() -> None:
    party = Party.create(net(), MOMENTUM)
    train(party, 1)
    blob = export_parties({"front": party, "head": Party.create(nn.Linear(2, 2), ADAM)})
    metadata = read_safetensors_metadata(blob)
    assert metadata["format"] == "medsplit.handoff"
    assert json.loads(metadata["parties"]) == ["front", "head"]
    assert "front:weight/0.weight" in json.loads(blob[8 : 8 + int.from_bytes(blob[:8], "little")])


def test_a_pickle_is_refused_not_loaded() -> None:
    class Boom:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (exec, ("raise SystemExit('unpickled!')",))

    party = Party.create(net(), MOMENTUM)
    with pytest.raises(HandoffError, match="not valid safetensors"):
        import_parties(pickle.dumps(Boom()), {"front": party})


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda b: b[:100], "not valid safetensors"),
        (lambda b: b"", "not valid safetensors"),
        (lambda b: b"\x00" * 8 + b[8:], "not valid safetensors"),
    ],
    ids=["truncated", "empty", "zero-header"],
)
def test_corrupt_bytes_are_refused(mangle, message: str) -> None:  # type: ignore[no-untyped-def]
    party = Party.create(net(), MOMENTUM)
    with pytest.raises(HandoffError, match=message):
        import_parties(mangle(export_parties({"front": party})), {"front": party})


def test_state_for_another_segment_is_refused_and_changes_nothing() -> None:
    sender = Party.create(net(width=5), MOMENTUM)
    train(sender, 2)
    receiver = Party.create(net(width=4), MOMENTUM)
    train(receiver, 1)
    before = snapshot(receiver)
    with pytest.raises(
        HandoffError,
        match=r"hand-off tensor '0\.bias' is torch\.float32 \[5\], expected torch\.float32 \[4\]",
    ):
        import_parties(export_parties({"front": sender}), {"front": receiver})
    for name, want in before.items():
        assert torch.equal(receiver.module.state_dict()[name], want), name


def test_missing_tensors_are_named() -> None:
    sender = Party.create(nn.Sequential(nn.Linear(3, 4)), MOMENTUM)
    receiver = Party.create(net(), MOMENTUM)
    with pytest.raises(HandoffError, match=r"missing \['1.bias'"):
        import_parties(export_parties({"front": sender}), {"front": receiver})


def test_wrong_optimizer_and_wrong_parties_are_refused() -> None:
    blob = export_parties({"front": Party.create(net(), ADAM)})
    with pytest.raises(HandoffError, match="'adam' optimizer state"):
        import_parties(blob, {"front": Party.create(net(), MOMENTUM)})
    with pytest.raises(HandoffError, match="holds parties"):
        import_parties(
            blob, {"front": Party.create(net(), ADAM), "head": Party.create(net(), ADAM)}
        )


def test_a_foreign_safetensors_file_is_refused() -> None:
    party = Party.create(net(), MOMENTUM)
    foreign = save_safetensors({"x": torch.zeros(2)}, metadata={"format": "pt"})
    with pytest.raises(HandoffError, match=r"expected 'medsplit\.handoff'"):
        import_parties(foreign, {"front": party})


def test_malformed_optimizer_metadata_is_refused_and_changes_nothing() -> None:
    party = Party.create(net(), MOMENTUM)
    train(party, 1)
    tensors, metadata = party.export_state("front:")
    metadata.update(
        format="medsplit.handoff", version="1", parties='["front"]', **{"front:param_groups": "{"}
    )
    before = snapshot(party)
    with pytest.raises(HandoffError, match="malformed"):
        import_parties(save_safetensors(tensors, metadata=metadata), {"front": party})
    for name, want in before.items():
        assert torch.equal(party.module.state_dict()[name], want)
