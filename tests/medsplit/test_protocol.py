"""Protocol roles: what crosses the cut, and refusing frames out of order or malformed."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from medsplit.channel import InMemoryChannel
from medsplit.cutting import split_model
from medsplit.errors import FrameError, ProtocolError
from medsplit.models import build_model
from medsplit.modes import get_mode
from medsplit.protocol.link import LocalLink
from medsplit.protocol.optim import OptimizerConfig
from medsplit.protocol.party import Party
from medsplit.protocol.roles import LABELS, StepIds
from medsplit.wire import Frame, FrameKind, decode_frame, encode_frame
from tests.redis_server import session_keys

SGD = OptimizerConfig(name="sgd", lr=0.1)
JOB = "job-1"


class RecordingChannel(InMemoryChannel):
    """An in-memory channel that keeps a copy of every payload, to inspect what crossed."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, bytes]] = []

    def send(self, stream: str, payload: bytes) -> None:
        self.log.append((stream, bytes(payload)))
        super().send(stream, payload)


def pair(mode: str, codec: str = "none"):  # type: ignore[no-untyped-def]
    model = build_model("skip_net", seed=0)
    cuts = ("block1",) if mode == "vanilla" else ("block1", "block3")
    split = split_model(model, torch.zeros(2, 1, 16, 16), cuts)
    names = {"front": 0} if mode == "vanilla" else {"front": 0, "head": 2}
    parties = {n: Party.create(copy.deepcopy(split.segments[i]), SGD) for n, i in names.items()}
    client = get_mode(mode).client_role(parties, split, codec=codec)
    server = get_mode(mode).server_role(
        Party.create(split.segments[1], SGD), split, job=JOB, codec=codec
    )
    return client, server, parties


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(4, 1, 16, 16, generator=gen), torch.randint(0, 2, (4,), generator=gen)


def weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def unchanged(module: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(module.state_dict()[k], v) for k, v in before.items())


@pytest.mark.parametrize("mode", ["vanilla", "ushaped"])
def test_only_cut_tensors_cross_and_labels_stay_home_in_ushaped(mode: str) -> None:
    """Invariant 2: no raw input leaves; in U-shaped mode no label either."""
    client, server, _ = pair(mode)
    channel = RecordingChannel()
    link = LocalLink(channel, session_keys().streams(JOB, "h1"))
    x, y = batch()
    link.run_step(client, server, StepIds(JOB, 0, 0, 0), x, y)

    up = [decode_frame(p) for s, p in channel.log if s.endswith(":up")]
    down = [decode_frame(p) for s, p in channel.log if s.endswith(":down")]
    assert [f.meta.kind for f in up] == (
        [FrameKind.ACTIVATIONS]
        if mode == "vanilla"
        else [FrameKind.ACTIVATIONS, FrameKind.HEAD_GRADIENTS]
    )
    assert len(down) == len(up)
    for frame in up + down:
        for name, tensor in frame.tensors.items():
            assert tensor.shape != x.shape, f"{name} has the shape of the raw input"
            assert not (tensor.dtype == y.dtype and torch.equal(tensor, y)) or (
                mode == "vanilla" and name == LABELS
            ), f"labels crossed as {name!r}"
    assert set(up[0].tensors) == {"stem", "block1"} | ({LABELS} if mode == "vanilla" else set())


def test_a_re_sent_step_is_answered_again_and_applied_once() -> None:
    """A hospital that lost the answer sends the step again: same answer, no second update."""
    client, server, _ = pair("vanilla")
    x, y = batch()
    frame = client.start(StepIds(JOB, 0, 0, 0), x, y)
    first = server.handle(frame)
    after_first = weights(server.tail.module)
    again = server.handle(frame)
    assert again.tensors.keys() == first.tensors.keys()
    assert all(torch.equal(again.tensors[k], first.tensors[k]) for k in first.tensors)
    assert unchanged(server.tail.module, after_first)


def test_a_re_sent_step_with_other_contents_or_an_older_step_is_refused() -> None:
    client, server, _ = pair("vanilla")
    x, y = batch()
    frame0 = client.start(StepIds(JOB, 0, 0, 0), x, y)
    server.handle(frame0)
    client.receive(server.handle(frame0))  # finish step 0 on the client
    frame1 = client.start(StepIds(JOB, 0, 0, 1), *batch(1))
    server.handle(frame1)
    before = weights(server.tail.module)
    tampered = dict(frame1.tensors)
    tampered["block1"] = tampered["block1"] + 1
    with pytest.raises(ProtocolError, match="again with different contents"):
        server.handle(Frame(frame1.meta, tampered))
    with pytest.raises(ProtocolError, match="already applied step"):
        server.handle(frame0)
    assert unchanged(server.tail.module, before)


@pytest.mark.parametrize("resend", ["activations", "head_gradients"])
def test_ushaped_server_answers_either_exchange_again(resend: str) -> None:
    client, server, _ = pair("ushaped")
    x, y = batch()
    up = client.start(StepIds(JOB, 0, 0, 0), x, y)
    down = server.handle(up)
    if resend == "activations":
        again = server.handle(up)
        assert all(torch.equal(again.tensors[k], down.tensors[k]) for k in down.tensors)
    head_grads = client.receive(down)
    final = server.handle(head_grads)
    after = weights(server.middle.module)
    if resend == "head_gradients":
        again = server.handle(head_grads)
        assert all(torch.equal(again.tensors[k], final.tensors[k]) for k in final.tensors)
    assert unchanged(server.middle.module, after)
    client.receive(final)


def test_vanilla_server_refuses_a_frame_of_another_kind() -> None:
    _, server, _ = pair("vanilla")
    frame = Frame(
        StepIds(JOB, 0, 0, 0).meta(FrameKind.HEAD_GRADIENTS, "vanilla", "none"),
        {"block1": torch.zeros(4, 32, 4, 4)},
    )
    with pytest.raises(ProtocolError, match="cannot handle a head_gradients frame"):
        server.handle(frame)


def test_server_refuses_another_jobs_frame() -> None:
    client, server, _ = pair("vanilla")
    x, y = batch()
    frame = client.start(StepIds("other-job", 0, 0, 0), x, y)
    with pytest.raises(ProtocolError, match="serves job 'job-1'"):
        server.handle(frame)


def test_client_refuses_gradients_for_another_step_and_changes_nothing() -> None:
    client, server, parties = pair("vanilla")
    x, y = batch()
    reply = server.handle(client.start(StepIds(JOB, 0, 0, 0), x, y))
    wrong = Frame(StepIds(JOB, 0, 0, 7).meta(FrameKind.GRADIENTS, "vanilla", "none"), reply.tensors)
    before = weights(parties["front"].module)
    with pytest.raises(ProtocolError, match="step in flight"):
        client.receive(wrong)
    assert unchanged(parties["front"].module, before)
    client.receive(reply)  # the right frame still completes the step
    assert not unchanged(parties["front"].module, before)


def test_client_cannot_start_a_step_while_one_is_in_flight() -> None:
    client, _, _ = pair("vanilla")
    x, y = batch()
    client.start(StepIds(JOB, 0, 0, 0), x, y)
    with pytest.raises(ProtocolError, match="still in flight"):
        client.start(StepIds(JOB, 0, 0, 1), x, y)


def test_ushaped_server_refuses_gradients_before_activations() -> None:
    _, server, _ = pair("ushaped")
    frame = Frame(
        StepIds(JOB, 0, 0, 0).meta(FrameKind.HEAD_GRADIENTS, "ushaped", "none"),
        {"block3": torch.zeros(4, 64, 4, 4)},
    )
    with pytest.raises(ProtocolError, match="no step in flight"):
        server.handle(frame)


def test_labels_of_another_batch_size_are_refused() -> None:
    client, server, _ = pair("vanilla")
    x, y = batch()
    frame = client.start(StepIds(JOB, 0, 0, 0), x, y)
    tensors = dict(frame.tensors)
    tensors[LABELS] = torch.zeros(3, dtype=torch.int64)
    before = weights(server.tail.module)
    with pytest.raises(ProtocolError, match=r"'batch size' check: tensors disagree"):
        server.handle(Frame(frame.meta, tensors))
    assert unchanged(server.tail.module, before)


def test_corrupt_or_ill_shaped_frames_fail_decoding_against_what_the_server_expects() -> None:
    client, server, _ = pair("vanilla")
    x, y = batch()
    frame = client.start(StepIds(JOB, 0, 0, 0), x, y)
    payload = encode_frame(frame)
    with pytest.raises(FrameError):
        decode_frame(payload[: len(payload) // 2], expect=server.expect())
    tensors = dict(frame.tensors)
    tensors["block1"] = torch.zeros(4, 32, 5, 5)
    with pytest.raises(FrameError, match="'block1': expected shape"):
        decode_frame(encode_frame(Frame(frame.meta, tensors)), expect=server.expect())
    tensors = dict(frame.tensors)
    del tensors[LABELS]
    with pytest.raises(FrameError, match=r"missing \['labels'\]"):
        decode_frame(encode_frame(Frame(frame.meta, tensors)), expect=server.expect())


def run_one_step(model: nn.Module, cut: str, config: OptimizerConfig = SGD) -> tuple:  # type: ignore[type-arg]
    split = split_model(model, torch.zeros(2, 3), cut)
    front = Party.create(split.front, config)
    client = get_mode("vanilla").client_role({"front": front}, split)
    server = get_mode("vanilla").server_role(Party.create(split.tail, config), split, job=JOB)
    channel = RecordingChannel()
    link = LocalLink(channel, session_keys().streams(JOB, "h"))
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    link.run_step(client, server, StepIds(JOB, 0, 0, 0), x, y)
    down = [decode_frame(p) for s, p in channel.log if s.endswith(":down")]
    return front, down[0]


def test_a_tensor_no_gradient_reaches_is_not_sent_back() -> None:
    """Sending zeros instead would make weight decay move weights that unsplit leaves alone."""

    class Gated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.c = nn.Linear(3, 3)
            self.b = nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h, k = self.a(x), self.c(x)
            return self.b(h) + (k > 0).float()[:, :2]  # k crosses but carries no gradient

    decay = OptimizerConfig(name="sgd", lr=0.1, weight_decay=0.5)
    model = Gated()
    front, frame = run_one_step(model, "c", decay)
    assert set(frame.tensors) == {"a", "loss"}
    assert torch.equal(front.module.state_dict()["c.weight"], model.state_dict()["c.weight"])
    assert not torch.equal(front.module.state_dict()["a.weight"], model.state_dict()["a.weight"])


def test_a_crossing_tensor_without_gradient_history_is_skipped_by_the_client() -> None:
    class Gate(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x > 0).float()

    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.gate = Gate()
            self.b = nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.a(x)
            return self.b(h * self.gate(h))  # the server computes a gradient for the mask

    front, frame = run_one_step(Masked(), "gate")
    assert {"a", "gate"} <= set(frame.tensors)
    assert front.module.state_dict()["a.weight"].shape == (3, 3)
