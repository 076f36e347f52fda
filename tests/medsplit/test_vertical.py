"""Vertical split learning in process: exact against one unsplit multi-input model."""

from __future__ import annotations

import json
import math

import pytest
import torch

from medsplit.cli import main
from medsplit.errors import ConfigError
from medsplit.models import build_model
from medsplit.modes import get_mode
from medsplit.protocol.optim import OptimizerConfig
from medsplit.protocol.roles import LABELS, LOSS
from medsplit.psi import IntersectionTooSmall, PsiError
from medsplit.training.config import TrainingConfig
from medsplit.training.label_leakage import LeakageScores, leakage_auc, norm_scores
from medsplit.training.vertical_job import VerticalJob, VerticalParty
from medsplit.training.vertical_model import (
    PartyModel,
    build_vertical,
    image_parts,
    same_model_parts,
    train_vertical_unsplit,
)
from medsplit.wire import decode_frame

N = 96


def _config(labels: str, join: str, **overrides: object) -> TrainingConfig:
    cuts = ("pool1", "pool") if labels == "hospital" else ("pool1",)
    values = dict(
        cuts=cuts,
        mode="vertical",
        mode_options={"join": join, "labels": labels},
        batch_size=16,
        rounds=2,
        seed=5,
        client_optimizer=OptimizerConfig(name="adam", lr=0.01),
        server_optimizer=OptimizerConfig(name="sgd", lr=0.05, momentum=0.9),
    )
    values.update(overrides)
    return TrainingConfig(**values)  # type: ignore[arg-type]


def _records(parts: int = 2) -> tuple[list[VerticalParty], torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(N, 1, 28, 28, generator=generator)
    y = torch.randint(0, 2, (N,), generator=generator)
    ids = [f"p{i:04d}" for i in range(N)]
    bands = image_parts(x, parts)
    # Each party misses a different eighth of the records: the alignment really works.
    gap = N // 8
    records = []
    for k, band in enumerate(bands):
        keep = [i for i in range(N) if not k * gap <= i < (k + 1) * gap]
        records.append(
            VerticalParty(
                f"h{k + 1}",
                tuple(ids[i] for i in keep),
                band[keep],
                y[keep] if k == 0 else None,
            )
        )
    return records, x, y


def _job(labels: str, join: str, parts: int = 2) -> tuple[VerticalJob, TrainingConfig]:
    config = _config(labels, join)
    names = [f"h{k + 1}" for k in range(parts)]
    model = build_model("small_cnn", seed=0)
    built = build_vertical(
        same_model_parts(model, torch.zeros(2, 1, 28, 28), config.cuts, names),
        mode=config.split_mode,  # type: ignore[arg-type]
        label_party="h1",
        seed=0,
    )
    records, _, _ = _records(parts)
    return VerticalJob(built, config, records, minimum=10), config


def _assert_exact(job: VerticalJob, config: TrainingConfig) -> None:
    reference = train_vertical_unsplit(job.model, job.all_batches(), config)
    got, want = job.state_dict(), reference.state_dict()
    assert got.keys() == want.keys()
    different = [name for name in want if not torch.equal(got[name], want[name])]
    assert not different, different
    # Training moved the weights: equality is not of two untouched copies.
    start = job.model.state_dict()
    assert any(not torch.equal(start[k], want[k]) for k in want)


@pytest.mark.parametrize(
    ("labels", "join", "parts"),
    [("hospital", "sum", 2), ("server", "mean", 3), ("hospital", "concat", 2)],
)
def test_a_vertical_job_equals_the_unsplit_multi_input_model(
    labels: str, join: str, parts: int
) -> None:
    job, config = _job(labels, join, parts)
    # 96 records, each party missing a different 12: the K-way intersection.
    assert len(job.alignment) == N - parts * (N // 8)
    reports = job.run()
    assert [r.steps for r in reports] == [len(job.alignment) // 16] * 2
    assert all(math.isfinite(r.mean_loss) for r in reports)
    _assert_exact(job, config)


def test_an_image_party_and_a_tabular_party_train_one_model_exactly() -> None:
    """Different architectures and inputs: a CNN on the images, the registry's tabular
    MLP on a table of features of the same patients, joined by concatenation."""
    mode = get_mode("vertical").with_options({"join": "concat", "labels": "server"})
    cnn = build_model("small_cnn", seed=1)
    mlp = build_model("tabular_mlp", in_channels=6, seed=2)
    built = build_vertical(
        {
            "imaging": PartyModel(cnn, torch.zeros(2, 1, 28, 28), ("flatten",)),
            "lab": PartyModel(mlp, torch.zeros(2, 6), ("block3",)),
        },
        mode=mode,
        label_party="imaging",
        seed=0,
    )
    # The joined embedding is 64 + 64 wide; the projection brings it back to the 64 the
    # CNN's top takes.
    assert built.top.projection.in_features == 128
    records, x, y = _records()
    ids = records[0].identifiers
    table = x.flatten(1)[:, :6].abs().log1p()
    parties = [
        VerticalParty("imaging", ids, x[: len(ids)], y[: len(ids)]),
        VerticalParty("lab", tuple(reversed(ids)), table[: len(ids)].flip(0)),
    ]
    config = TrainingConfig(
        cuts=("flatten",),
        mode="vertical",
        mode_options={"join": "concat", "labels": "server"},
        batch_size=16,
        seed=1,
    )
    job = VerticalJob(built, config, parties, minimum=10)
    job.run()
    _assert_exact(job, config)


class _Recording:
    """An in-memory channel that keeps every payload sent, by stream."""

    def __init__(self) -> None:
        from medsplit.channel import InMemoryChannel

        self.inner = InMemoryChannel()
        self.sent: list[tuple[str, bytes]] = []

    def send(self, stream: str, payload: bytes) -> None:
        self.sent.append((stream, payload))
        self.inner.send(stream, payload)

    def receive(self, stream: str, timeout: float) -> bytes:
        return self.inner.receive(stream, timeout=timeout)


def test_with_the_labels_at_home_no_label_or_loss_crosses_and_passive_parties_get_no_loss() -> None:
    job, config = _job("hospital", "sum")
    channel = _Recording()
    job.channel = channel  # type: ignore[assignment]
    job.config = config.__class__(**{**config.__dict__, "rounds": 1})  # type: ignore[arg-type]
    job.run()
    assert channel.sent
    for stream, payload in channel.sent:
        frame = decode_frame(payload)
        assert LABELS not in frame.tensors, stream
        assert LOSS not in frame.tensors, stream
    # The passive party's frames name only its own embedding.
    passive = [decode_frame(p) for s, p in channel.sent if ":h2:" in s]
    assert passive and all(set(f.tensors) <= {"pool1"} for f in passive)


def test_with_the_labels_at_the_server_only_the_label_party_sends_labels_and_hears_the_loss() -> (
    None
):
    job, _ = _job("server", "sum")
    channel = _Recording()
    job.channel = channel  # type: ignore[assignment]
    job.run()
    for stream, payload in channel.sent:
        frame = decode_frame(payload)
        mine = ":h1:" in stream
        assert (LABELS in frame.tensors) == (mine and stream.endswith(":up")), stream
        assert (LOSS in frame.tensors) == (mine and stream.endswith(":down")), stream


def test_the_join_and_the_cut_refuse_what_cannot_be_joined() -> None:
    mode = get_mode("vertical").with_options({"join": "sum", "labels": "server"})
    cnn = build_model("small_cnn", seed=0)
    mlp = build_model("tabular_mlp", in_channels=4, seed=0)
    with pytest.raises(ConfigError, match="one shape"):
        build_vertical(
            {
                "a": PartyModel(cnn, torch.zeros(2, 1, 28, 28), ("pool1",)),
                "b": PartyModel(mlp, torch.zeros(2, 4), ("block1",)),
            },
            mode=mode,
            label_party="a",
        )
    skip = build_model("skip_net", seed=0)
    with pytest.raises(ConfigError, match="party 'a': its cut lets 2 tensors cross"):
        build_vertical(
            same_model_parts(skip, torch.zeros(2, 1, 28, 28), ("block1",), ["a", "b"]),
            mode=mode,
            label_party="a",
        )
    with pytest.raises(ConfigError, match="the head of 'a' holds no parameters"):
        build_vertical(
            same_model_parts(cnn, torch.zeros(2, 1, 28, 28), ("flatten", "fc"), ["a", "b"]),
            mode=get_mode("vertical"),
            label_party="a",
        )
    with pytest.raises(ConfigError, match="two or more parties"):
        build_vertical(
            same_model_parts(cnn, torch.zeros(2, 1, 28, 28), ("pool1",), ["a"]),
            mode=mode,
            label_party="a",
        )


def test_alignment_refuses_a_tiny_intersection_and_duplicates_before_any_step() -> None:
    job, config = _job("hospital", "sum")
    records, _, _ = _records()
    few = VerticalParty("h2", records[0].identifiers[:5], records[1].features[:5])
    with pytest.raises(IntersectionTooSmall, match="below the job's minimum of 10"):
        VerticalJob(job.model, config, [records[0], few], minimum=10)
    twice = records[1].identifiers[:-1] + records[1].identifiers[:1]
    duplicated = VerticalParty("h2", twice, records[1].features)
    with pytest.raises(PsiError, match="repeats item 1; each record needs its own identifier"):
        VerticalJob(job.model, config, [records[0], duplicated], minimum=10)


def test_the_label_leakage_scores_find_labels_in_separable_gradients() -> None:
    labels = torch.tensor([0, 1] * 8)
    # Positives' gradients larger and pointing the other way: both attacks recover them.
    base = 1.0 + torch.rand(16, 4, generator=torch.Generator().manual_seed(0))
    gradients = torch.where(labels[:, None] == 1, -3.0 * base, base)
    assert leakage_auc(norm_scores(gradients), labels) == 1.0
    scores = LeakageScores()
    scores.add(gradients, labels)
    report = scores.report()
    assert report["norm_auc"] == 1.0 and report["cosine_strength"] == 1.0
    assert leakage_auc(norm_scores(gradients), torch.tensor([0, 1, 2] * 5 + [0])) is None


def test_medsplit_verify_and_simulate_run_the_vertical_mode(capsys: pytest.CaptureFixture) -> None:
    code = main(
        ["verify", "small_cnn", "--mode", "vertical", "--hospitals", "3", "--steps", "4", "--json"]
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out)["exact"] is True
    args = ["simulate", "--mode", "vertical", "--hospitals", "2", "--rounds", "1"]
    args += ["--local-epochs", "1", "--samples", "64", "--batch-size", "16", "--json"]
    args += ["--min-records", "10"]
    assert main(args) == 0
    rounds = json.loads(capsys.readouterr().out)
    assert rounds[0]["steps"] == (64 - 2 * 6) // 16
    assert set(rounds[0]["label_leakage"]) == {"hospital-2"}
    assert "val_accuracy" in rounds[0]["validation"]
