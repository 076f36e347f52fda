"""Benchmark segmentation (issue 21) in process: a U-shaped UNet job's Dice and traffic.

Run from the repository root::

    .venv/bin/python bench/bench_segmentation.py                  # both parts, seeds 0,1,2
    .venv/bin/python bench/bench_segmentation.py --parts dice --seeds 0,1,2,3,4
    .venv/bin/python bench/bench_segmentation.py --parts traffic --json

Everything runs in this process through :class:`medsplit.training.SplitJob` (what
``medsplit simulate`` runs): every step's frames are encoded and cross an in-memory
channel, every hand-off goes through bytes. Nothing here goes through the relay, Redis or
Celery.

Data: MONAI's synthetic discs and their masks (``monai.data.synthetic.create_test_image_2d``
through :func:`medsplit.data.synthetic_segmentation_split`), 1x32x32, three classes
(background and two kinds of disc, told apart by their brightness), noise up to 0.6 of
the brightest class, so that neither run reaches a Dice of 1; a training set and a test
set drawn from different seeds; the training set dealt to three hospitals as the
simulator deals it (``medsplit.data.shard``).

Parts (``--parts``, both by default):

* ``dice``: for each seed, two trainings from the same initial ``unet`` weights (the
  registry's, built with the seed): **centralized**, the whole UNet over the union of the
  training set, one shuffled ``DataLoader`` (seeded), E epochs; **U-shaped**, a job over
  the three hospitals, E rounds of one local epoch, cut in the encoder's second level and
  before the last layer (``model.skip.submodule.down`` / ``model.skip``: the front and the
  last layer, with the masks and the loss, stay at the hospital). Both: Adam, lr 0.005,
  cosine schedule to zero over the run's steps, batch 16, DiceCE loss, every sample once an
  epoch. Score: mean Dice of the foreground (MONAI's ``DiceMetric``,
  ``include_background=False``, :func:`medsplit.training.evaluate.segmentation_metrics`)
  of the final weights on the test set. Goal: the job's mean Dice within 0.01 of
  centralized (the mean over seeds of the difference). The first seed's job is also
  checked against unsplit training over the very same batch sequence
  (``train_unsplit``): every weight identical (``torch.equal``).
* ``traffic``: one epoch of the three hospitals, U-shaped and vanilla. Measured: the round
  report's bytes up and down (every frame of every step, headers included), and the
  channel's decoded payloads, their tensor bytes counted apart from their headers.
  Analytic, per epoch of ``p`` samples in ``s`` steps, ``b`` = 4 bytes: every tensor
  crossing the first cut goes up and its gradient comes down, the skip tensors included
  (``q1`` values per sample: the first level's output, 16x16x16, and the second's,
  32x8x8); U-shaped adds the tensor at the second cut up to the head and its gradient
  back (``q2``, 32x16x16): ``2·p·(q1 + q2)·b``; vanilla sends the masks up, int64, and
  the loss down: ``2·p·q1·b + 8·p·H·W + 4·s``. The figure counting only the main path's
  tensor at the first cut (what a cut table blind to skip connections would say) is
  given beside it.

Nothing here asserts on time; the figures are printed (``--json``: as one object).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from report import command_line, environment, table, today

from medsplit.channel import InMemoryChannel
from medsplit.data import DataSplit, shard, synthetic_segmentation_split
from medsplit.models import build_model, get_model_spec
from medsplit.modes import get_mode
from medsplit.protocol.optim import OptimizerConfig
from medsplit.protocol.party import Party
from medsplit.protocol.roles import LABELS, LOSS
from medsplit.training.config import TrainingConfig
from medsplit.training.evaluate import evaluate
from medsplit.training.reference import train_unsplit
from medsplit.training.schedule import turn_length
from medsplit.training.split_job import Hospital, SplitJob
from medsplit.training.tasks import SEGMENTATION, make_loss
from medsplit.training.verify import deterministic
from medsplit.wire import decode_frame

PARTS = ("dice", "traffic")
MODEL = "unet"
HOSPITALS = 3
SHAPE = (1, 32, 32)
GOAL_DICE = 0.01
GOAL_TRAFFIC = 1.02
B = 4  # bytes per float32 value


@dataclass(frozen=True)
class Settings:
    """What the centralized and the split runs share."""

    lr: float = 0.005
    batch_size: int = 16
    epochs: int = 8
    train: int = 480
    test: int = 160
    classes: int = 3
    noise: float = 0.6

    def optimizer(self, total_steps: int) -> OptimizerConfig:
        return OptimizerConfig(name="adam", lr=self.lr, schedule="cosine", total_steps=total_steps)


def say(message: str) -> None:
    print(f"bench_segmentation | {message}", file=sys.stderr, flush=True)


def data_of(settings: Settings, seed: int) -> tuple[DataSplit, DataSplit]:
    """The training and test sets of a seed (different generator seeds)."""
    common: dict[str, Any] = dict(shape=SHAPE, num_classes=settings.classes, noise=settings.noise)
    train = synthetic_segmentation_split(settings.train, seed=seed, **common)
    test = synthetic_segmentation_split(settings.test, seed=10_000 + seed, **common)
    return train, test


def hospitals_of(train: DataSplit, seed: int) -> list[Hospital]:
    return [
        Hospital(f"hospital-{i + 1}", s) for i, s in enumerate(shard(train, HOSPITALS, seed=seed))
    ]


def dice_on(segments: list[torch.nn.Module], test: DataSplit) -> float:
    evaluation = evaluate(segments, test, batch_size=64, task=SEGMENTATION)
    assert evaluation.dice is not None
    return evaluation.dice


def train_centralized(
    model: torch.nn.Module, train: DataSplit, settings: Settings, seed: int
) -> tuple[torch.nn.Module, int]:
    """The whole UNet over all the data, shuffled by one seeded DataLoader."""
    whole = copy.deepcopy(model)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(train.images, train.labels),
        batch_size=settings.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    steps = settings.epochs * len(loader)
    party = Party.create(whole, settings.optimizer(steps))
    loss_fn = make_loss(SEGMENTATION)
    for _ in range(settings.epochs):
        for x, y in loader:
            loss_fn(whole(x), y).backward()
            party.step()
    return whole, steps


def split_config(
    mode: str, settings: Settings, hospitals: list[Hospital], seed: int, *, rounds: int
) -> TrainingConfig:
    """The job's config; the cosine schedule spans the job's own number of steps."""
    base: dict[str, Any] = dict(
        cuts=get_mode(mode).default_cuts(get_model_spec(MODEL)),
        mode=mode,
        batch_size=settings.batch_size,
        rounds=rounds,
        local_epochs=1,
        seed=seed,
        drop_last=False,  # like the DataLoader: every sample every epoch
        job=f"segmentation-{mode}-{seed}",
        task=SEGMENTATION,
    )
    probe = TrainingConfig(**base)
    steps = rounds * sum(turn_length(probe, len(h.train)) for h in hospitals)
    optimizer = settings.optimizer(steps)
    return TrainingConfig(**base, client_optimizer=optimizer, server_optimizer=optimizer)


def run_seed(settings: Settings, seed: int, *, check: bool) -> dict[str, Any]:
    train, test = data_of(settings, seed)
    hospitals = hospitals_of(train, seed)
    model = build_model(MODEL, num_classes=settings.classes, seed=seed)
    out: dict[str, Any] = {"seed": seed, "hospital_samples": [len(h.train) for h in hospitals]}
    with deterministic():
        start = time.perf_counter()
        whole, steps = train_centralized(model, train, settings, seed)
        out["centralized"] = {
            "dice": dice_on([whole], test),
            "steps": steps,
            "seconds": time.perf_counter() - start,
        }
        say(f"seed {seed} centralized: Dice {out['centralized']['dice']:.4f}, {steps} steps")
        start = time.perf_counter()
        config = split_config("ushaped", settings, hospitals, seed, rounds=settings.epochs)
        job = SplitJob(model, train.images[:2], config)
        reports = job.run(hospitals)
        exact = None
        if check:
            reference = train_unsplit(model, [h.train for h in hospitals], config, job.split)
            want = reference.state_dict()
            got = job.state_dict()
            exact = set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
        out["ushaped"] = {
            "dice": dice_on(job.segments(), test),
            "steps": sum(r.steps for r in reports),
            "exact_vs_unsplit_same_batches": exact,
            "seconds": time.perf_counter() - start,
        }
        say(
            f"seed {seed} ushaped: Dice {out['ushaped']['dice']:.4f}, "
            f"{out['ushaped']['steps']} steps, exact={exact}"
        )
    out["difference"] = out["ushaped"]["dice"] - out["centralized"]["dice"]
    return out


def spread(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}


def measure_dice(args: argparse.Namespace) -> dict[str, Any]:
    settings = args.settings
    per_seed = [run_seed(settings, s, check=i == 0) for i, s in enumerate(args.seeds)]
    difference = spread([r["difference"] for r in per_seed])
    return {
        "settings": asdict(settings),
        "per_seed": per_seed,
        "centralized": spread([r["centralized"]["dice"] for r in per_seed]),
        "ushaped": spread([r["ushaped"]["dice"] for r in per_seed]),
        "difference": difference,
        "goal_met": abs(difference["mean"]) <= GOAL_DICE,
        "exact": per_seed[0]["ushaped"]["exact_vs_unsplit_same_batches"],
    }


# -- traffic -----------------------------------------------------------------------------


class CountingChannel(InMemoryChannel):
    """An in-memory channel that decodes every payload it carries and counts its tensor
    bytes by role (at a cut, the masks, the loss) and its header."""

    def __init__(self) -> None:
        super().__init__()
        self.tally: dict[str, int] = defaultdict(int)

    def send(self, stream: str, payload: bytes) -> None:
        super().send(stream, payload)
        frame = decode_frame(bytes(payload))
        raw = 0
        for name, tensor in frame.tensors.items():
            size = tensor.numel() * tensor.element_size()
            raw += size
            self.tally[{LABELS: "masks", LOSS: "loss"}.get(name, "cut")] += size
        self.tally["header"] += len(payload) - raw
        self.tally["frames"] += 1
        self.tally["payload"] += len(payload)


def traffic_case(mode: str, settings: Settings, seed: int) -> dict[str, Any]:
    """One epoch of the three hospitals: the job's bytes against the analytic cost."""
    train, _ = data_of(settings, seed)
    hospitals = hospitals_of(train, seed)
    config = split_config(mode, settings, hospitals, seed, rounds=1)
    channel = CountingChannel()
    model = build_model(MODEL, num_classes=settings.classes, seed=seed)
    job = SplitJob(model, train.images[:2], config, channel=channel)
    (report,) = job.run([Hospital(h.name, h.train) for h in hospitals])
    p, s = report.samples, report.steps
    first = {t.name: t.numel for t in job.split.boundaries[0]}
    q1 = sum(first.values())
    q2 = sum(t.numel for t in job.split.boundaries[1]) if mode == "ushaped" else 0
    main_path = first[next(reversed(first))]  # the tensor the cut module itself made
    cut = 2 * p * (q1 + q2) * B
    pixels = SHAPE[1] * SHAPE[2]
    extra = 8 * p * pixels + 4 * s if mode == "vanilla" else 0
    analytic = cut + extra
    measured = report.bytes_up + report.bytes_down
    tally = dict(channel.tally)
    return {
        "mode": mode,
        "cuts": list(config.cuts),
        "p": p,
        "steps": s,
        "first_cut": first,
        "q1": q1,
        "q2": q2,
        "analytic": analytic,
        "analytic_cut": cut,
        "analytic_without_skips": 2 * p * (main_path + q2) * B + extra,
        "bytes_up": report.bytes_up,
        "bytes_down": report.bytes_down,
        "measured": measured,
        "ratio": measured / analytic,
        "goal_met": measured / analytic <= GOAL_TRAFFIC,
        "channel": tally,
        "channel_equals_report": tally["payload"] == measured,
        "cut_equals_analytic": tally["cut"] == cut,
        "header_per_frame": tally["header"] / tally["frames"],
    }


def measure_traffic(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for mode in ("ushaped", "vanilla"):
        row = traffic_case(mode, args.settings, args.seeds[0])
        say(f"traffic {mode}: ratio {row['ratio']:.4f}")
        rows.append(row)
    return {"rows": rows, "batch_size": args.settings.batch_size, "train": args.settings.train}


# -- the tables ----------------------------------------------------------------------------


def _range(s: Mapping[str, float], *, many: bool, signed: bool = False) -> str:
    f = "{:+.4f}" if signed else "{:.4f}"
    text = f.format(s["mean"])
    if many:
        text += f" ({f.format(s['min'])} to {f.format(s['max'])})"
    return text


def markdown_dice(part: Mapping[str, Any], date: str) -> str:
    many = len(part["per_seed"]) > 1
    settings = part["settings"]
    seeds = ", ".join(str(r["seed"]) for r in part["per_seed"])
    goal = "met" if part["goal_met"] else "**not met**"
    first = part["per_seed"][0]
    rows = [
        [
            date,
            "centralized (one shuffled loader over all the data)",
            _range(part["centralized"], many=many),
            first["centralized"]["steps"],
            "–",
        ],
        [
            date,
            f"U-shaped job, {HOSPITALS} hospitals",
            _range(part["ushaped"], many=many),
            first["ushaped"]["steps"],
            f"{_range(part['difference'], many=many, signed=True)}: {goal}",
        ],
    ]
    text = table(
        [
            "date",
            "training",
            "test mean Dice",
            "steps",
            f"Δ vs centralized, goal within {GOAL_DICE}",
        ],
        rows,
    )
    exact = {True: "**yes**", False: "**NO**", None: "not checked"}[part["exact"]]
    return (
        f"{text}\n\nMean over seeds {seeds} (range in brackets); Δ is the job minus "
        f"centralized, seed by seed. `unet` ({SHAPE[0]}x{SHAPE[1]}x{SHAPE[2]}, channels "
        f"16-32-64), {settings['train']} training images of MONAI's synthetic discs "
        f"({settings['classes']} classes, noise up to {settings['noise']}) dealt to "
        f"{HOSPITALS} hospitals, {settings['test']} test images; adam lr {settings['lr']} "
        f"cosine, batch {settings['batch_size']}, {settings['epochs']} epochs (rounds of one "
        "local epoch), DiceCE loss; Dice of the foreground (MONAI `DiceMetric`, background "
        "left out). The first seed's job identical (`torch.equal`) to unsplit training over "
        f"the same batches: {exact}."
    )


def markdown_traffic(part: Mapping[str, Any]) -> str:
    rows = []
    for r in part["rows"]:
        rows.append(
            [
                r["mode"],
                " / ".join(r["cuts"]),
                ", ".join(f"{n} {v:,}" for n, v in r["first_cut"].items()),
                f"{r['q2']:,}" if r["q2"] else "–",
                f"{r['analytic']:,}",
                f"{r['analytic_without_skips']:,}",
                f"{r['bytes_up']:,}",
                f"{r['bytes_down']:,}",
                f"{r['ratio']:.4f}",
                "yes" if r["cut_equals_analytic"] and r["channel_equals_report"] else "**NO**",
            ]
        )
    text = table(
        [
            "mode",
            "cuts",
            "crossing the first cut (values per sample)",
            "q2",
            "analytic bytes",
            "without the skip tensor",
            "bytes up",
            "bytes down",
            "measured / analytic",
            "tensor bytes = analytic",
        ],
        rows,
    )
    r = part["rows"][0]
    return (
        f"{text}\n\nOne epoch: {r['p']} samples in {r['steps']} steps (batch "
        f"{part['batch_size']}, {HOSPITALS} hospitals, a hospital's last batch short where "
        "its share does not divide); "
        f"analytic: U-shaped `2·p·(q1 + q2)·4`, vanilla `2·p·q1·4 + 8·p·H·W + 4·s` (the "
        "int64 masks up, the loss down); *without the skip tensor*: the same with only the "
        "main path's tensor at the first cut; measured: the round report's bytes, headers "
        "included (the channel's decoded payloads agree, and their tensor bytes equal the "
        f"analytic count exactly); goal ≤ {GOAL_TRAFFIC}."
    )


def markdown(result: dict[str, Any]) -> str:
    """The section's tables for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    parts = result["parts"]
    env = result["env"]
    out = [
        f"Measured {result['date']}, `{result['command']}`, torch {env['threads']} thread"
        f"{'s' if env['threads'] != 1 else ''}, {env['cpus']} CPUs, {result['seconds']:.0f} s "
        "in all."
    ]
    if "dice" in parts:
        out += ["**Mean Dice**", markdown_dice(parts["dice"], result["date"])]
    if "traffic" in parts:
        out += [
            "**Traffic per epoch against the analytic cost**",
            markdown_traffic(parts["traffic"]),
        ]
    return "\n\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"from {', '.join(PARTS)}")
    parser.add_argument(
        "--seeds", default="0,1,2", help="the dice part's seeds (the first: traffic)"
    )
    parser.add_argument("--epochs", type=int, default=Settings.epochs)
    parser.add_argument("--train", type=int, default=Settings.train, help="training images")
    parser.add_argument("--test", type=int, default=Settings.test, help="test images")
    parser.add_argument("--lr", type=float, default=Settings.lr)
    parser.add_argument("--classes", type=int, default=Settings.classes, help="background too")
    parser.add_argument("--noise", type=float, default=Settings.noise, help="in [0, 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if not args.parts or set(args.parts) - set(PARTS):
        parser.error(f"--parts: choose from {', '.join(PARTS)}")
    if not args.seeds or min(args.seeds) < 0:
        parser.error("--seeds needs one or more integers >= 0")
    if args.epochs < 1 or args.train < HOSPITALS or args.test < 1:
        parser.error("--epochs and --test must be >= 1, --train >= the hospitals")
    args.settings = Settings(
        lr=args.lr,
        epochs=args.epochs,
        train=args.train,
        test=args.test,
        classes=args.classes,
        noise=args.noise,
    )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    parts: dict[str, Any] = {}
    for part in PARTS:
        if part not in args.parts:
            continue
        begun = time.perf_counter()
        parts[part] = measure_dice(args) if part == "dice" else measure_traffic(args)
        parts[part]["seconds"] = time.perf_counter() - begun
        say(f"{part} done in {parts[part]['seconds']:.0f} s")
    result = {
        "date": today(),
        "command": command_line("bench_segmentation.py", argv),
        "parts": parts,
        "env": environment(),
        "seconds": time.perf_counter() - start,
    }
    print(json.dumps(result, indent=2) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
