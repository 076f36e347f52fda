"""Benchmark: the bytes a split-learning epoch moves, measured, against the analytic cost of
split learning and of federated learning.

Run from the repository root, with Redis running (``REDIS_URL``, default
``redis://127.0.0.1:6379/0``)::

    .venv/bin/python bench/bench_traffic.py   # small_cnn, resnet18, densenet121; vanilla, U-shaped
    .venv/bin/python bench/bench_traffic.py --case small_cnn:1,28,28:breastmnist --json

Each case runs a real round-robin job of ``--hospitals`` (3) hospitals for ``--rounds`` (1)
round, in vanilla and in U-shaped mode (the registry's default cuts), in this process; a
job that fails is reported with its error and the others still run. Per turn, the server's
``medsplit.turns.TurnServer`` (in a thread; no-op coordinator hooks, checkpoints in
memory) and the hospital's ``TurnClient``, each with its own ``RedisChannel`` to the local
Redis, so every frame of the runtime crosses: the handshake, the training steps, the
validation batches at the end of the turn and the metrics. Each channel is wrapped in a
counter that records every payload it sends (its length, and its frame decoded: kind and
tensor sizes) and every payload it receives (the totals must match). After its turn the
hospital hands its state on as the agent does (``TurnTaker.hand_on`` in ``hospital_agent``): the
safetensors bytes of ``export_parties``, sealed (``medsplit.protocol.sealing``: HPKE
ML-KEM-768 + X25519 to a per-job key, ML-DSA-65 signed) for every other participant and
left on the relay with ``SET``; the next
hospital ``GET``s and unseals the one sealed for it. The blob sizes are counted.

Data: the hospitals' shares of the MedMNIST ``.npz`` files in ``../shared/data``
(``shard`` of the train and val splits), resized with bilinear interpolation when the
case's input is larger than 28x28; synthetic images of the same sizes when the files are
absent. Defaults: small_cnn 1x28x28 on PneumoniaMNIST, resnet18 and densenet121 at
1x64x64 on BreastMNIST (small, so that they run in minutes). Codec ``none``, batch 32,
the last short batch of each turn dropped, SGD with momentum 0.9 on every side, one local
epoch per turn, 1 torch thread.

The analytic cost of one epoch (Singh et al., 2019, "Detailed comparison of communication
efficiency of split learning and federated learning"), with ``p`` the training
samples of the epoch (over all hospitals), ``q`` the values crossing the cut per sample,
``b`` bytes per value (4, float32), ``K`` hospitals, ``N`` the model's parameters and
``N_c`` those the hospitals hold:

* split learning: ``2·p·q·b`` (activations up, their gradients down) ``+ K·N_c·b`` (one
  hand-off of the hospital's weights per turn). U-shaped mode crosses two cuts, each
  twice per sample: ``q = q1 + q2``, and ``N_c`` counts the front and the head.
* the same with optimizer state: ``+ K·S·b`` where ``S`` is the optimizer's state values
  (SGD with momentum: one per parameter), since a hand-off carries it so that the next
  hospital continues exactly.
* federated learning (FedAvg, one local epoch per round): ``2·N·K·b``, every hospital
  downloads and uploads the whole model.

Measured, per epoch: *core* is the bytes of every training frame (both ways, with their
headers, and in vanilla mode the labels and the loss) plus one sealed hand-off per turn
(the blob for the next hospital in the ring); *all* adds the validation and control frames
and the blobs sealed for the other ``K - 2`` participants. Each message counts once (as it
is sent; the relay's own framing, Redis stream fields and RESP, is not counted). The goal
is core / analytic <= 1.02; it is reported against the analytic cost with and without
optimizer state, and every byte beyond ``2·p·q·b + K·N_c·b`` is attributed to one of:
frame headers, labels, loss, buffers (batch-norm statistics), optimizer state,
safetensors header and metadata of the hand-off, sealing, validation frames, control
frames, fan-out. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from report import table, today

GOAL = 1.02
REPO = Path(__file__).resolve().parents[1]
DATA_FILES = {
    "breastmnist": "breastmnist_28.npz",
    "pneumoniamnist": "pneumoniamnist_28_reconstructed.npz",
}
SYNTHETIC_SIZES = {"breastmnist": (546, 78), "pneumoniamnist": (4708, 524)}
DEFAULT_CASES = (
    "small_cnn:1,28,28:pneumoniamnist",
    "resnet18:1,64,64:breastmnist",
    "densenet121:1,64,64:breastmnist",
)
MODES = ("vanilla", "ushaped")
LR, MOMENTUM = 0.01, 0.9
TRAINING_KINDS = ("activations", "gradients", "head_activations", "head_gradients")
EVAL_KINDS = ("eval_activations", "eval_outputs")


def log(message: str) -> None:
    print(f"[bench_traffic] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--case",
        action="append",
        help="MODEL[:C,H,W[:DATA]], DATA one of breastmnist, pneumoniamnist, synthetic "
        f"(repeatable; default {' '.join(DEFAULT_CASES)})",
    )
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--hospitals", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--data-dir", default=os.environ.get("MEDSPLIT_DATA", str(REPO.parent / "shared" / "data"))
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    args.case = args.case or list(DEFAULT_CASES)
    args.modes = [m for m in args.modes.split(",") if m]
    if args.hospitals < 2 or args.rounds < 1:
        parser.error("need --hospitals >= 2 and --rounds >= 1")
    return args


@dataclass(frozen=True)
class Case:
    model: str
    shape: tuple[int, ...]
    data: str

    @classmethod
    def parse(cls, text: str) -> Case:
        from medsplit.models import get_model_spec

        parts = text.split(":")
        spec = get_model_spec(parts[0])
        shape = tuple(int(s) for s in parts[1].split(",")) if len(parts) > 1 and parts[1] else None
        data = parts[2] if len(parts) > 2 else "breastmnist"
        return cls(parts[0], shape or spec.default_input_shape, data)


# -- data ---------------------------------------------------------------------------------


def load_data(case: Case, folder: Path) -> tuple[Any, Any, str]:
    """Train and val splits for the case's input shape, and where they came from."""
    import torch

    from medsplit.data import DataSplit, load_medmnist, synthetic_split

    path = folder / DATA_FILES.get(case.data, "-")
    if case.data in DATA_FILES and path.is_file():
        train, val = load_medmnist(path, "train"), load_medmnist(path, "val")
        source = f"{case.data} ({path.name})"
    else:
        n_train, n_val = SYNTHETIC_SIZES.get(case.data, (546, 78))
        train = synthetic_split(n_train, shape=case.shape, seed=1)
        val = synthetic_split(n_val, shape=case.shape, seed=2)
        why = "" if case.data == "synthetic" else f", {path} absent"
        source = f"synthetic ({n_train} + {n_val}{why})"
    if tuple(train.images.shape[1:]) != case.shape:
        if train.images.shape[1] != case.shape[0]:
            raise SystemExit(f"{case}: the data has {train.images.shape[1]} channels")

        def fit(split: DataSplit) -> DataSplit:
            images = torch.nn.functional.interpolate(
                split.images, size=case.shape[1:], mode="bilinear", align_corners=False
            )
            return DataSplit(images.clamp(0, 1).contiguous(), split.labels)

        train, val = fit(train), fit(val)
        source += f", resized to {'x'.join(map(str, case.shape[1:]))}"
    return train, val, source


# -- counting -------------------------------------------------------------------------------


@dataclass
class Tally:
    """Bytes of frames by kind, and of the tensors inside them by role."""

    sent: int = 0
    received: int = 0
    frames: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    count: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    tensors: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # cut/labels/loss
    samples: int = 0  # batch sizes of the activation frames
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, payload: bytes) -> None:
        from medsplit.protocol.roles import LABELS, LOSS
        from medsplit.wire import decode_frame

        frame = decode_frame(payload)
        kind = frame.meta.kind.value
        raw = {name: t.numel() * t.element_size() for name, t in frame.tensors.items()}
        with self.lock:
            self.sent += len(payload)
            self.frames[kind] += len(payload)
            self.count[kind] += 1
            if kind in TRAINING_KINDS:
                for name, size in raw.items():
                    role = {LABELS: "labels", LOSS: "loss"}.get(name, "cut")
                    self.tensors[role] += size
                self.tensors["header"] += len(payload) - sum(raw.values())
                if kind == "activations":
                    self.samples += next(iter(frame.tensors.values())).shape[0]


def counting_channel(url: str, tally: Tally):
    """A ``RedisChannel`` whose every payload is counted in ``tally``."""
    from medsplit.channel import RedisChannel

    class Counting(RedisChannel):
        def send(self, stream: str, payload: bytes) -> None:
            super().send(stream, payload)
            tally.record(bytes(payload))

        def receive(self, stream: str, *, timeout: float) -> bytes:
            payload = super().receive(stream, timeout=timeout)
            with tally.lock:
                tally.received += len(payload)
            return payload

    return Counting(url)


class NoHooks:
    """The coordinator's side of a turn, doing nothing: run (until told to stop), record
    nothing."""

    def __init__(self) -> None:
        self.stop = threading.Event()

    def directive(self):
        from medsplit.turns import Directive

        return Directive.STOP if self.stop.is_set() else Directive.RUN

    def progress(self, progress: object) -> None:
        pass

    def finish(self, metrics: object, progress: object) -> None:
        pass

    def resumed(self, step: int, reason: str) -> None:
        pass


def handoff_parts(state: bytes, parties: dict[str, Any]) -> dict[str, int]:
    """The bytes of a hand-off's plaintext by role: parameters, buffers, optimizer state,
    and the safetensors header with its metadata (JSON of optimizer groups, schedule)."""
    from safetensors.torch import load

    params = {
        f"{name}:weight/{p}"
        for name, party in parties.items()
        for p, _ in party.module.named_parameters()
    }
    parts = {"params": 0, "buffers": 0, "optimizer": 0}
    for key, tensor in load(state).items():
        size = tensor.numel() * tensor.element_size()
        if ":optim/" in key:
            parts["optimizer"] += size
        elif key in params:
            parts["params"] += size
        else:
            parts["buffers"] += size
    parts["header"] = len(state) - sum(parts.values())
    return parts


# -- one job --------------------------------------------------------------------------------


def run_job(case: Case, mode: str, data: tuple[Any, Any], args: argparse.Namespace) -> dict:
    import redis

    from medsplit.channel import RelayKeys
    from medsplit.data import shard
    from medsplit.models import get_model_spec
    from medsplit.modes import get_mode
    from medsplit.protocol.handoff import export_parties
    from medsplit.protocol.keys import RecipientKey, SignedRecipientKey, generate_identity_key
    from medsplit.protocol.optim import OptimizerConfig
    from medsplit.protocol.sealing import SealContext, seal, unseal
    from medsplit.training.config import TrainingConfig
    from medsplit.training.setup import JobModel, client_parties, server_party
    from medsplit.turns import (
        ClientOutcome,
        MemoryCheckpointStore,
        MemorySnapshots,
        ServerOutcome,
        TurnClient,
        TurnIds,
        TurnServer,
    )
    from medsplit.turns.server import SERVER_PARTY

    spec = get_model_spec(case.model)
    cuts = get_mode(mode).default_cuts(spec)
    job = f"bench-traffic-{uuid.uuid4().hex[:10]}"
    optimizer = OptimizerConfig(name="sgd", lr=LR, momentum=MOMENTUM)
    config = TrainingConfig(
        cuts=cuts,
        mode=mode,
        client_optimizer=optimizer,
        server_optimizer=optimizer,
        batch_size=args.batch_size,
        rounds=args.rounds,
        job=job,
    )
    model = JobModel(case.model, len(case.shape) - 1, case.shape[0], 2, case.shape, seed=0)
    split = model.split_at(cuts)
    train, val = data
    names = [f"h{i}" for i in range(args.hospitals)]
    trains = shard(train, args.hospitals, seed=0)
    vals = shard(val, args.hospitals, seed=0)
    identities = {name: generate_identity_key() for name in names}
    job_keys = {name: RecipientKey.generate() for name in names}
    published = {
        name: SignedRecipientKey.sign(
            job=job, hospital=name, key=job_keys[name].public(), identity=identities[name]
        )
        for name in names
    }
    tally = Tally()
    server = server_party(split, config)
    relay = redis.Redis.from_url(args.redis_url)
    state = export_parties(client_parties(split, config))  # the job's seed: no hand-off
    blobs: list[dict[str, Any]] = []
    plain: dict[str, int] = defaultdict(int)  # hand-off plaintext by part, summed over turns
    previous: tuple[str, int] | None = None
    relay_keys: list[str] = []
    began = time.monotonic()
    try:
        for round_ in range(args.rounds):
            for position, name in enumerate(names):
                if previous is not None:
                    sender, sent_round = previous
                    blob = relay.get(RelayKeys().mail(job, sender=sender, recipient=name))
                    context = SealContext(job, sent_round, sender, name)
                    state = unseal(
                        blob,
                        recipient=job_keys[name],
                        sender=identities[sender].public_key(),
                        context=context,
                    )
                ids = TurnIds(job, round_, position, config.mode, config.codec)
                streams = RelayKeys().streams(job, name)
                relay_keys += [streams.up, streams.down, streams.up + ":seq", streams.down + ":seq"]
                server_channel = counting_channel(args.redis_url, tally)
                client_channel = counting_channel(args.redis_url, tally)
                hooks = NoHooks()
                turn_server = TurnServer(
                    ids=ids,
                    channel=server_channel,
                    streams=streams,
                    split=split,
                    party=server,
                    store=MemoryCheckpointStore(export_parties({SERVER_PARTY: server})),
                    hooks=hooks,
                    batch_size=config.batch_size,
                    silence_timeout=60.0,
                )
                outcome: list[object] = []
                thread = threading.Thread(
                    target=lambda s=turn_server, o=outcome: o.append(s.run()), daemon=True
                )
                thread.start()
                client = TurnClient(
                    ids=ids,
                    channel=client_channel,
                    streams=streams,
                    split=split,
                    parties=lambda: client_parties(split, config),
                    start=state,
                    config=config,
                    train=trains[position],
                    val=vals[position] if len(vals[position]) else None,
                    snapshots=MemorySnapshots(),
                    reply_timeout=300.0,
                )
                try:
                    report = client.run()
                finally:
                    hooks.stop.set()  # a server left waiting (the hospital failed) stops
                    thread.join(90)
                server_channel.close()
                client_channel.close()
                if report.outcome != ClientOutcome.COMPLETED or outcome != [
                    ServerOutcome.COMPLETED
                ]:
                    raise RuntimeError(f"turn {name}: hospital {report.outcome}, server {outcome}")
                state = client.state()
                for part, size in handoff_parts(state, client.parties).items():
                    plain[part] += size
                plain["total"] += len(state)
                plain["turns"] += 1
                following = names[(position + 1) % len(names)]
                for other in names:
                    if other == name:
                        continue
                    context = SealContext(job, round_, name, other)
                    blob = seal(
                        state,
                        sender=identities[name],
                        recipient=published[other],
                        recipient_identity=identities[other].public_key(),
                        context=context,
                    )
                    key = RelayKeys().mail(job, sender=name, recipient=other)
                    relay.set(key, blob, ex=3600)
                    relay_keys.append(key)
                    blobs.append({"size": len(blob), "ring": other == following})
                previous = (name, round_)
                log(
                    f"{case.model} {mode}: round {round_} {name} done "
                    f"({report.steps} steps, {time.monotonic() - began:.0f} s)"
                )
    finally:
        if relay_keys:
            relay.delete(*relay_keys)
        relay.close()

    rounds = args.rounds
    K = args.hospitals
    elem = 4
    q_cuts = [sum(t.numel for t in boundary) for boundary in split.boundaries]
    qb = sum(t.nbytes for boundary in split.boundaries for t in boundary)
    client_index = config.split_mode.client_segments().values()
    n_client = sum(p.numel() for i in client_index for p in split.segments[i].parameters())
    n_all = sum(p.numel() for s in split.segments for p in s.parameters())
    optimizer_values = n_client  # SGD with momentum: one buffer per parameter
    p = tally.samples // rounds
    cut_analytic = 2 * p * qb
    handoff_analytic = K * n_client * elem
    analytic = cut_analytic + handoff_analytic
    analytic_opt = analytic + K * optimizer_values * elem
    training = sum(tally.frames[k] for k in TRAINING_KINDS) // rounds
    ring = sum(b["size"] for b in blobs if b["ring"]) // rounds
    fan_out = sum(b["size"] for b in blobs if not b["ring"]) // rounds
    evaluation = sum(tally.frames[k] for k in EVAL_KINDS) // rounds
    control = (tally.sent // rounds) - training - evaluation
    core = training + ring
    everything = core + evaluation + control + fan_out

    def per_epoch(part: str) -> int:
        return plain[part] // rounds

    breakdown = {
        "cut values (= 2·p·q·b)": tally.tensors["cut"] // rounds,
        "frame headers (training frames)": tally.tensors["header"] // rounds,
        "labels": tally.tensors["labels"] // rounds,
        "loss": tally.tensors["loss"] // rounds,
        "hand-off parameters (= K·N_c·b)": per_epoch("params"),
        "hand-off buffers (batch-norm statistics)": per_epoch("buffers"),
        "hand-off optimizer state": per_epoch("optimizer"),
        "hand-off safetensors header + metadata": per_epoch("header"),
        "hand-off sealing": ring - per_epoch("total"),
        "validation frames": evaluation,
        "control frames (handshake, metrics, done)": control,
        "hand-offs sealed for the other K-2 hospitals": fan_out,
    }
    return {
        "model": case.model,
        "input_shape": list(case.shape),
        "mode": mode,
        "cuts": list(cuts),
        "hospitals": K,
        "rounds": rounds,
        "batch_size": args.batch_size,
        "p": p,
        "q_per_cut": q_cuts,
        "b": elem,
        "N": n_all,
        "N_client": n_client,
        "optimizer_state_values": optimizer_values,
        "train_samples": len(train),
        "val_samples": len(val),
        "frames_sent": dict(tally.count),
        "bytes_sent_equals_received": tally.sent == tally.received,
        "handoff_plaintext_per_turn": {
            k: v // plain["turns"] for k, v in plain.items() if k != "turns"
        },
        "handoff_blob": blobs[-1]["size"],
        "breakdown_sums_to_all": sum(breakdown.values()) == everything,
        "analytic": {
            "cut_2pqb": cut_analytic,
            "handoff_K_Nc_b": handoff_analytic,
            "split": analytic,
            "split_with_optimizer_state": analytic_opt,
            "federated_2NKb": 2 * n_all * K * elem,
        },
        "measured": {
            "training_frames": training,
            "handoffs_one_per_turn": ring,
            "core": core,
            "validation_frames": evaluation,
            "control_frames": control,
            "handoff_fan_out": fan_out,
            "all": everything,
        },
        "ratio_core_vs_weights": core / analytic,
        "ratio_core_vs_weights_and_optimizer": core / analytic_opt,
        "ratio_training_frames_vs_2pqb": training / cut_analytic,
        "ratio_all_vs_weights": everything / analytic,
        "ratio_all_vs_federated": everything / (2 * n_all * K * elem),
        "breakdown": breakdown,
        "seconds": time.monotonic() - began,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    folder = Path(args.data_dir)
    jobs = []
    for text in args.case:
        case = Case.parse(text)
        train, val, source = load_data(case, folder)
        log(f"{case.model} {case.shape}: {source}, {len(train)} train + {len(val)} val")
        for mode in args.modes:
            try:
                result = run_job(case, mode, (train, val), args)
            except Exception as e:  # reported as this job's result; the others still run
                log(f"{case.model} {mode} FAILED: {type(e).__name__}: {e}")
                error = f"{type(e).__name__}: {e}".splitlines()[0]
                jobs.append(
                    {
                        "model": case.model,
                        "input_shape": list(case.shape),
                        "mode": mode,
                        "data": source,
                        "error": error,
                    }
                )
                continue
            result["data"] = source
            jobs.append(result)
            log(
                f"{case.model} {mode}: core / analytic {result['ratio_core_vs_weights']:.4f} "
                f"(with optimizer state {result['ratio_core_vs_weights_and_optimizer']:.4f})"
            )
    return {
        "jobs": jobs,
        "goal": GOAL,
        "optimizer": f"sgd lr {LR} momentum {MOMENTUM}",
        "codec": "none",
        "date": today(),
        "command": shlex.join(sys.orig_argv),
        "threads": args.threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


# -- output -------------------------------------------------------------------------------


def _bytes(n: float) -> str:
    return f"{n:,.0f}"


def _verdict(ratio: float, goal: float) -> str:
    return f"**{ratio:.4f}** ({'met' if ratio <= goal else 'not met'})"


def markdown(result: dict[str, Any]) -> str:
    """The section's tables for ``docs/benchmarks.md``."""
    goal = result["goal"]
    date = result["date"]

    def label(job: dict) -> str:
        shape = "x".join(map(str, job["input_shape"]))
        return f"{job['model']} {shape}, {job['mode']}"

    done = [job for job in result["jobs"] if "error" not in job]
    failed = [job for job in result["jobs"] if "error" in job]
    ratios = table(
        [
            "date",
            "model, mode",
            "p · q (per cut)",
            "N_c / N",
            "analytic 2pqb + K·N_c·b",
            "measured core",
            f"core / analytic, weights only (goal ≤ {goal})",
            f"core / analytic + K·S·b, with optimizer state (goal ≤ {goal})",
            "all measured / analytic",
            "FL 2·N·K·b",
            "all measured / FL",
        ],
        [
            [
                date,
                label(job),
                f"{job['p']} · {' + '.join(map(str, job['q_per_cut']))}",
                f"{job['N_client']:,} / {job['N']:,}",
                _bytes(job["analytic"]["split"]),
                _bytes(job["measured"]["core"]),
                _verdict(job["ratio_core_vs_weights"], goal),
                _verdict(job["ratio_core_vs_weights_and_optimizer"], goal),
                f"{job['ratio_all_vs_weights']:.4f}",
                _bytes(job["analytic"]["federated_2NKb"]),
                f"{job['ratio_all_vs_federated']:.4f}",
            ]
            for job in done
        ]
        + [[date, label(job), f"failed: {job['error']}", *["–"] * 8] for job in failed],
    )
    items = list(done[0]["breakdown"])
    rows = []
    for item in items:
        row = [item]
        for job in done:
            value = job["breakdown"][item]
            share = value / job["analytic"]["split"]
            row.append(f"{_bytes(value)} ({share:.2%})" if value else "0")
        rows.append(row)
    breakdown = table(["bytes per epoch (% of analytic)", *map(label, done)], rows)
    data = "; ".join(sorted({f"{j['model']}: {j['data']}" for j in result["jobs"]}))
    first = done[0]
    same = all(j["bytes_sent_equals_received"] for j in done)
    sums = all(j["breakdown_sums_to_all"] for j in done)
    return (
        f"{ratios}\n\n{breakdown}\n\n"
        f"{first['hospitals']} hospitals, {first['rounds']} round(s) of one local epoch, "
        f"batch {first['batch_size']}, codec {result['codec']}, {result['optimizer']}; "
        f"data {data}. Per epoch; b = 4 bytes. Bytes received equal bytes sent on every "
        f"channel: {'yes' if same else 'NO'}; the rows above add up to all measured: "
        f"{'yes' if sums else 'NO'}."
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = measure(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
