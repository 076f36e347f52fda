"""Benchmark vertical split learning (issue 19) in process: accuracy and traffic.

Run from the repository root::

    .venv/bin/python bench/bench_vertical.py                       # both parts, a table each
    .venv/bin/python bench/bench_vertical.py --parts accuracy --seeds 0,1,2,3,4
    .venv/bin/python bench/bench_vertical.py --parts traffic --json

Everything runs in this process through :class:`medsplit.training.vertical_job.VerticalJob`:
the parties align their records by real private set intersection (``openmined-psi``, the
label party the client of one session with each other party, the digests checked), and
every step's frames are encoded and cross an in-memory channel. Nothing here goes through
the relay, Redis or Celery.

Parts (``--parts``, both by default):

* ``accuracy``: on BreastMNIST and PneumoniaMNIST, for each seed, three trainings from the
  same initial ``small_cnn`` weights (the registry's, built with the seed), over the same
  batch sequence (the job's: :func:`medsplit.psi.epoch_batches` of the intersection in
  the seed's order, every record once an epoch, the last batch short):

  - **vertical**: two parties, each holding one band of columns of every training image
    (left and right halves, zeros elsewhere: ``image_parts``), every record at both (full
    overlap, so the comparison with whole images is like for like), the labels at the
    label party (``labels=hospital``: it keeps the head and the loss), each party's front
    a copy of ``small_cnn``'s (cut ``pool1`` / ``pool``), the embeddings joined by ``sum``
    (and, a second job, by ``concat``: the top then starts with a learned 1×1 projection);
  - **multi-input, central**: the same vertical model trained whole in one process on the
    same batches (``train_vertical_unsplit``); with codec ``none`` its weights must equal
    the job's (``torch.equal``), which the run checks (the first seed's jobs, every
    seed's with ``--check-all-seeds``);
  - **centralized, whole images**: ``small_cnn`` trained whole on the same batches of
    whole images (the bands put back together).

  All with ``bench_accuracy``'s settings (Adam lr 0.002, cosine schedule to zero over the
  run's steps, batch 16, BreastMNIST 40 epochs, PneumoniaMNIST 5). Scores: accuracy and
  ROC AUC on the official test split (split into the same bands for the vertical model,
  ``score_vertical``), beside the majority-class baseline; the label-leakage audit's AUCs
  of the passive party's last epoch are kept.
* ``traffic``: one epoch of BreastMNIST (the simulator's records, ``vertical_records``:
  each party lacks a different 10 %, so two share 80 %) for joins ``sum`` and ``concat``,
  labels at home and at the server, two and three parties. Measured: the round report's
  bytes up and down (every frame of every step, headers included), and every payload the
  channel carried, decoded, so that its tensor bytes and headers are counted apart.
  Analytic, per epoch of ``p`` samples in ``s`` steps (``K`` parties, ``q`` values per
  sample of each party's embedding, ``b`` = 4 bytes): ``2·p·K·q·b`` (each embedding up,
  its gradient down), with the labels at home ``+ 2·p·q_h·b`` (the top's output to the
  label party, its gradient back; ``q_h`` its values per sample), with the labels at the
  server ``+ 8·p + 4·s`` (int64 labels up, the float32 loss down). Goal ≤ 1.02.

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
from collections.abc import Iterable, Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from bench_accuracy import DATA_DIR, DATASETS, TITLES, Settings
from report import command_line, environment, table, today

from medsplit.channel import InMemoryChannel
from medsplit.data import DataSplit, load_medmnist
from medsplit.models import build_model, get_model_spec
from medsplit.modes import get_mode
from medsplit.protocol.party import Party
from medsplit.protocol.roles import LABELS, LOSS
from medsplit.training.config import TrainingConfig
from medsplit.training.evaluate import classification_metrics, majority_baseline
from medsplit.training.schedule import turn_length
from medsplit.training.verify import deterministic
from medsplit.training.vertical_job import VerticalJob, VerticalParty, score_vertical
from medsplit.training.vertical_model import (
    VerticalModel,
    build_vertical,
    image_parts,
    same_model_parts,
    train_vertical_unsplit,
)
from medsplit.training.vertical_simulate import vertical_records
from medsplit.wire import decode_frame

PARTS = ("accuracy", "traffic")
JOINS = ("sum", "concat")
GOAL_POINTS = 1.0
GOAL_TRAFFIC = 1.02
PARTIES = 2
B = 4  # bytes per float32 value
# (join, labels, parties) of the traffic part
TRAFFIC_CASES: tuple[tuple[str, str, int], ...] = (
    ("sum", "hospital", 2),
    ("sum", "server", 2),
    ("concat", "hospital", 2),
    ("concat", "server", 2),
    ("sum", "hospital", 3),
)


def say(message: str) -> None:
    print(f"bench_vertical | {message}", file=sys.stderr, flush=True)


def names_of(k: int) -> list[str]:
    return [f"hospital-{i + 1}" for i in range(k)]


def vertical_config(
    settings: Settings, *, join: str, labels: str, seed: int, rounds: int, aligned: int
) -> TrainingConfig:
    """The job's config; the cosine schedule spans its steps over ``aligned`` records."""
    options = {"join": join, "labels": labels}
    cuts = get_mode("vertical").with_options(options).default_cuts(get_model_spec(settings.model))
    probe = TrainingConfig(
        cuts=cuts,
        mode="vertical",
        mode_options=options,
        batch_size=settings.batch_size,
        rounds=rounds,
        local_epochs=1,
        seed=seed,
        drop_last=False,  # as bench_accuracy's DataLoader: every record every epoch
        job=f"vertical-bench-{join}-{labels}-{seed}",
    )
    optimizer = settings.optimizer_config(rounds * turn_length(probe, aligned))
    return replace(probe, client_optimizer=optimizer, server_optimizer=optimizer)


def full_overlap(data: DataSplit, names: list[str]) -> list[VerticalParty]:
    """Every party holds its band of every record; the first also the labels."""
    identifiers = tuple(f"patient-{i:06d}" for i in range(len(data)))
    bands = image_parts(data.images, len(names))
    return [
        VerticalParty(name, identifiers, band, data.labels if k == 0 else None)
        for k, (name, band) in enumerate(zip(names, bands, strict=True))
    ]


def build(
    model: torch.nn.Module, config: TrainingConfig, example: torch.Tensor, k: int
) -> VerticalModel:
    """The vertical model of ``k`` parties, each a copy of ``model``; the first labels."""
    names = names_of(k)
    return build_vertical(
        same_model_parts(model, example, config.cuts, names),
        mode=config.split_mode,  # type: ignore[arg-type]
        label_party=names[0],
        seed=config.seed,
    )


def same_weights(a: VerticalModel, b: VerticalModel) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return set(sa) == set(sb) and all(torch.equal(sa[key], sb[key]) for key in sa)


def train_whole(
    model: torch.nn.Module,
    batches: Iterable[tuple[Mapping[str, torch.Tensor], torch.Tensor]],
    config: TrainingConfig,
) -> torch.nn.Module:
    """``model`` trained whole on the batches' images put back together (the bands are
    disjoint, zeros elsewhere, so their sum is each image exactly)."""
    whole = copy.deepcopy(model)
    party = Party.create(whole, config.client_optimizer)
    loss_fn = torch.nn.CrossEntropyLoss()
    for inputs, labels in batches:
        images = sum(inputs.values())
        loss_fn(whole(images), labels).backward()
        party.step()
    return whole


def whole_scores(model: torch.nn.Module, test: DataSplit) -> dict[str, float]:
    with torch.no_grad():
        model.eval()
        logits = torch.cat([model(x) for x in test.images.split(256)])
        model.train()
    metrics = classification_metrics(logits, test.labels)
    return {"accuracy": metrics["val_accuracy"], "auc": metrics["val_auc"]}


def vertical_scores(model: VerticalModel, test: DataSplit) -> dict[str, float]:
    inputs = dict(zip(model.parties, image_parts(test.images, len(model.parties)), strict=True))
    metrics = score_vertical(model, inputs, test.labels)
    return {"accuracy": metrics["val_accuracy"], "auc": metrics["val_auc"]}


def training_split(path: Path, limit: int | None, seed: int) -> DataSplit:
    """The training split, or a seeded random ``limit`` of it."""
    train = load_medmnist(path, "train")
    if limit is None or limit >= len(train):
        return train
    keep = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))[:limit]
    keep = keep.sort().values
    return replace(train, images=train.images[keep], labels=train.labels[keep])


# -- accuracy ----------------------------------------------------------------------------


def accuracy_seed(
    path: Path,
    settings: Settings,
    seed: int,
    *,
    joins: tuple[str, ...],
    check: bool,
    limit: int | None,
) -> dict[str, Any]:
    """The vertical job of each join (with ``check``, the same model trained centrally on
    its batches too), and ``small_cnn`` on whole images over the same batches."""
    train, test = training_split(path, limit, seed), load_medmnist(path, "test")
    model = build_model(settings.model, seed=seed)
    parties = full_overlap(train, names_of(PARTIES))
    out: dict[str, Any] = {"seed": seed, "train_records": len(train)}
    batches: list[tuple[dict[str, torch.Tensor], torch.Tensor]] = []
    with deterministic():
        for join in joins:
            start = time.perf_counter()
            config = vertical_config(
                settings,
                join=join,
                labels="hospital",
                seed=seed,
                rounds=settings.epochs,
                aligned=len(train),
            )
            built = build(model, config, train.images[:2], PARTIES)
            job = VerticalJob(built, config, parties)
            aligned = time.perf_counter() - start
            reports = job.run()
            trained = job.trained()
            out[f"vertical_{join}"] = {
                **vertical_scores(trained, test),
                "steps": sum(r.steps for r in reports),
                "aligned": len(job.alignment),
                "align_s": aligned,
                "leakage_last_epoch": reports[-1].leakage,
                "seconds": time.perf_counter() - start,
            }
            # Every join's job sees the same batches (the alignment's order is the seed's).
            mine = list(job.all_batches())
            if batches and not all(
                torch.equal(a[1], b[1]) for a, b in zip(batches, mine, strict=True)
            ):
                raise AssertionError(f"the {join} job's batches differ from the first job's")
            batches = batches or mine
            if check:
                start = time.perf_counter()
                unsplit = train_vertical_unsplit(built, mine, config)
                out[f"unsplit_{join}"] = {
                    **vertical_scores(unsplit, test),
                    "equal_to_job": same_weights(unsplit, trained),
                    "seconds": time.perf_counter() - start,
                }
        start = time.perf_counter()
        whole = train_whole(model, batches, config)
        out["centralized"] = {
            **whole_scores(whole, test),
            "steps": len(batches),
            "seconds": time.perf_counter() - start,
        }
    equal = {j: out[f"unsplit_{j}"]["equal_to_job"] for j in joins if f"unsplit_{j}" in out}
    say(
        f"{path.name} seed {seed}: "
        + ", ".join(
            f"{run} {out[run]['accuracy']:.3f}/{out[run]['auc']:.3f}"
            for run in runs_of(joins)
            if run in out
        )
        + (f", equal to the same model trained centrally: {equal}" if equal else "")
    )
    return out


def runs_of(joins: Iterable[str]) -> list[str]:
    """The runs of a seed, in the tables' order."""
    return [run for j in joins for run in (f"vertical_{j}", f"unsplit_{j}")] + ["centralized"]


def label_of(run: str) -> str:
    if run == "centralized":
        return "centralized, whole images"
    kind, join = run.split("_")
    if kind == "vertical":
        return f"vertical job, {join}"
    return f"the same multi-input model ({join}), central"


def spread(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}


def accuracy_summary(per_seed: list[dict[str, Any]], joins: list[str]) -> dict[str, Any]:
    """Mean and range over seeds of each score and of each vertical job's gaps (points):
    against the same model trained centrally over the seeds that ran it, against
    whole-image training over all."""
    summary: dict[str, Any] = {}
    for run in runs_of(joins):
        seeds = [s for s in per_seed if run in s]
        if seeds:
            summary[run] = {m: spread([s[run][m] for s in seeds]) for m in ("accuracy", "auc")}
            summary[run]["seeds"] = len(seeds)
            summary[run]["seed_list"] = [s["seed"] for s in seeds]
    for join in joins:
        run = f"vertical_{join}"
        for base in (f"unsplit_{join}", "centralized"):
            seeds = [s for s in per_seed if base in s]
            if not seeds:
                continue
            gaps: dict[str, Any] = {
                m: spread([100 * (s[run][m] - s[base][m]) for s in seeds])
                for m in ("accuracy", "auc")
            }
            gaps["seeds"] = len(seeds)
            gaps["seed_list"] = [s["seed"] for s in seeds]
            key = "unsplit" if base.startswith("unsplit") else base
            summary[f"{run}_minus_{key}_points"] = gaps
            summary[f"{run}_within_{key}"] = all(
                gaps[m]["mean"] >= -GOAL_POINTS for m in ("accuracy", "auc")
            )
    checked = [
        s[f"unsplit_{j}"]["equal_to_job"] for s in per_seed for j in joins if f"unsplit_{j}" in s
    ]
    summary["equal_checked"] = len(checked)
    summary["equal_every_checked"] = all(checked)
    for join in joins:
        leak = [s[f"vertical_{join}"]["leakage_last_epoch"] for s in per_seed]
        for attack in ("norm_strength", "cosine_strength"):
            values = [v[attack] for lk in leak for v in lk.values() if v.get(attack) is not None]
            if values:
                summary[f"vertical_{join}_leakage_{attack}"] = spread(values)
    return summary


def measure_accuracy(args: argparse.Namespace) -> dict[str, Any]:
    datasets = {}
    for name in args.datasets:
        path = args.data_dir / DATASETS[name][0]
        settings = Settings(
            model=args.model,
            lr=args.lr,
            batch_size=args.batch_size,
            epochs=args.epochs or DATASETS[name][1],
        )
        limit = args.limit.get(name)
        per_seed = [
            accuracy_seed(
                path,
                settings,
                seed,
                joins=tuple(args.joins),
                check=args.check_all_seeds or i == 0,
                limit=limit,
            )
            for i, seed in enumerate(args.seeds)
        ]
        train = load_medmnist(path, "train")
        test = load_medmnist(path, "test")
        baseline = majority_baseline(train.labels, test.labels)
        datasets[name] = {
            "settings": asdict(settings),
            "train_limit": limit,
            "train_records": per_seed[0]["train_records"],
            "test_records": len(test),
            "majority_baseline": {"label": baseline.label, "accuracy": baseline.accuracy},
            "per_seed": per_seed,
            "summary": accuracy_summary(per_seed, args.joins),
        }
    return {"seeds": args.seeds, "parties": PARTIES, "joins": args.joins, "datasets": datasets}


# -- traffic -----------------------------------------------------------------------------


class CountingChannel(InMemoryChannel):
    """An in-memory channel that decodes every payload it carries and counts its tensor
    bytes by role (embedding or gradient at a cut, labels, loss) and its header."""

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
            self.tally[{LABELS: "labels", LOSS: "loss"}.get(name, "cut")] += size
        self.tally["header"] += len(payload) - raw
        self.tally["frames"] += 1
        self.tally["payload"] += len(payload)


def traffic_case(
    path: Path, join: str, labels: str, k: int, seed: int, limit: int | None = None
) -> dict[str, Any]:
    """One epoch of a vertical job: its bytes against the analytic cost."""
    settings = Settings(epochs=1)
    train = training_split(path, limit, seed)
    parties = vertical_records(train, names_of(k))
    shared = len(set.intersection(*(set(p.identifiers) for p in parties)))
    config = vertical_config(
        settings, join=join, labels=labels, seed=seed, rounds=1, aligned=shared
    )
    model = build_model(settings.model, seed=seed)
    built = build(model, config, train.images[:2], k)
    channel = CountingChannel()
    job = VerticalJob(built, config, parties, channel=channel)
    (report,) = job.run()
    p, s = report.samples, report.steps
    q = {name: t.numel for name, t in built.inputs.items()}
    q_h = sum(t.numel for t in built.head_boundary) if built.head_boundary else 0
    cut = 2 * p * sum(q.values()) * B + 2 * p * q_h * B
    extra = 8 * p + 4 * s if labels == "server" else 0
    analytic = cut + extra
    measured = report.bytes_up + report.bytes_down
    tally = dict(channel.tally)
    return {
        "join": join,
        "labels": labels,
        "parties": k,
        "records_each": len(parties[0].identifiers),
        "aligned": len(job.alignment),
        "p": p,
        "steps": s,
        "q": q,
        "q_h": q_h,
        "analytic": analytic,
        "analytic_cut": cut,
        "bytes_up": report.bytes_up,
        "bytes_down": report.bytes_down,
        "measured": measured,
        "ratio": measured / analytic,
        "goal_met": measured / analytic <= GOAL_TRAFFIC,
        "channel": tally,
        "channel_equals_report": tally["payload"] == measured,
        "cut_equals_analytic": tally["cut"] == cut,
        "header_per_frame": tally["header"] / tally["frames"],
        "frames_per_step": tally["frames"] / s,
    }


def measure_traffic(args: argparse.Namespace) -> dict[str, Any]:
    path = args.data_dir / DATASETS["breastmnist"][0]
    rows = []
    for join, labels, k in TRAFFIC_CASES:
        row = traffic_case(path, join, labels, k, args.seeds[0], args.limit.get("breastmnist"))
        say(f"traffic {join}/{labels}/K={k}: ratio {row['ratio']:.4f}")
        rows.append(row)
    return {
        "dataset": "breastmnist",
        "batch_size": Settings.batch_size,
        "train_limit": args.limit.get("breastmnist"),
        "rows": rows,
    }


# -- the tables ----------------------------------------------------------------------------


def _range(s: Mapping[str, float], *, many: bool, signed: bool = False) -> str:
    """``mean (min–max)``; signed figures are points, with a real minus sign."""
    fmt = "+.1f" if signed else ".3f"
    digits = 1 if signed else 3
    # Adding 0.0 turns a rounded -0.0 into 0.0.
    mean, lo, hi = (round(s[key], digits) + 0.0 for key in ("mean", "min", "max"))
    text = f"{mean:{fmt}}"
    if many:
        text += f" ({lo:{fmt}} to {hi:{fmt}})" if signed else f" ({lo:{fmt}}–{hi:{fmt}})"
    return text.replace("-", "−")


def _gap(summary: Mapping[str, Any], run: str, base: str, *, many: bool) -> str:
    points = summary.get(f"{run}_minus_{base}_points")
    if points is None:
        return "–"
    many = many and points["seeds"] > 1
    text = ", ".join(_range(points[m], many=many, signed=True) for m in ("accuracy", "auc"))
    verdict = "met" if summary[f"{run}_within_{base}"] else "**not met**"
    if base == "unsplit":  # checked on some seeds only; the weights were equal there
        text += f" (seed {', '.join(str(x) for x in points['seed_list'])})"
    return f"{text}: {verdict}"


def markdown_accuracy(part: Mapping[str, Any], date: str) -> str:
    many = len(part["seeds"]) > 1
    rows = []
    notes = []
    for name, data in part["datasets"].items():
        summary = data["summary"]
        for run in runs_of(part["joins"]):
            if run not in summary:
                continue
            vertical = run.startswith("vertical")
            wide = many and summary[run]["seeds"] > 1
            rows.append(
                [
                    date,
                    TITLES.get(name, name),
                    label_of(run)
                    + (
                        ""
                        if summary[run]["seeds"] == len(part["seeds"])
                        else f" (seed {', '.join(str(x) for x in summary[run]['seed_list'])})"
                    ),
                    _range(summary[run]["accuracy"], many=wide),
                    _range(summary[run]["auc"], many=wide),
                    _gap(summary, run, "unsplit", many=many) if vertical else "–",
                    _gap(summary, run, "centralized", many=many) if vertical else "–",
                ]
            )
        base = data["majority_baseline"]
        limit = data["train_limit"]
        leaks = []
        for join in part["joins"]:
            norm = summary.get(f"vertical_{join}_leakage_norm_strength")
            cosine = summary.get(f"vertical_{join}_leakage_cosine_strength")
            if norm and cosine:
                leaks.append(
                    f"{join} norm {_range(norm, many=many)}, cosine {_range(cosine, many=many)}"
                )
        notes.append(
            f"{TITLES.get(name, name)}: {data['settings']['epochs']} epochs over "
            f"{data['train_records']:,} training records"
            + (f" (a seeded random {limit:,} of the split)" if limit else " (the whole split)")
            + f", test {data['test_records']:,}, majority-class baseline "
            f"{base['accuracy']:.3f}"
            + (
                "; label-leakage audit of the passive party's last epoch, attack strength "
                "max(AUC, 1 − AUC): " + "; ".join(leaks)
                if leaks
                else ""
            )
        )
    summaries = [d["summary"] for d in part["datasets"].values()]
    equal = all(s["equal_every_checked"] for s in summaries)
    checked = sum(s["equal_checked"] for s in summaries)
    seeds = ", ".join(str(x) for x in part["seeds"])
    settings = next(iter(part["datasets"].values()))["settings"]
    return (
        table(
            [
                "date",
                "dataset",
                "training",
                "test accuracy",
                "test AUC",
                f"Δ vs the same model central (acc, AUC), goal ≥ −{GOAL_POINTS:g}",
                f"Δ vs centralized whole images (acc, AUC), ≥ −{GOAL_POINTS:g}?",
            ],
            rows,
        )
        + f"\n\n{'Mean over seeds' if many else 'Seed'} {seeds}"
        + (" (range in brackets)" if many else "")
        + "; Δ is the vertical job minus the other run, seed by seed, in points, its mean "
        f"against {GOAL_POINTS:g} point. {part['parties']} parties (left and right halves of "
        "every image, every record at both), labels at the label party, "
        f"`{settings['model']}` cut `pool1` / `pool`, {settings['optimizer']} lr "
        f"{settings['lr']} cosine, batch {settings['batch_size']}, the same batches in every "
        "run of a seed. "
        + "; ".join(notes)
        + ". Vertical jobs' weights identical (`torch.equal`) to the same multi-input "
        f"model trained centrally on the same batches: **{'yes' if equal else 'NO'}** "
        f"({checked} job{'s' if checked != 1 else ''} checked)."
    )


def markdown_traffic(part: Mapping[str, Any]) -> str:
    rows = []
    for r in part["rows"]:
        q = sorted(set(r["q"].values()))
        rows.append(
            [
                r["join"],
                r["labels"],
                r["parties"],
                f"{r['aligned']:,} of {r['records_each']:,}",
                f"{r['p']:,}",
                r["steps"],
                "/".join(f"{v:,}" for v in q),
                f"{r['q_h']:,}" if r["q_h"] else "–",
                f"{r['analytic']:,}",
                f"{r['bytes_up']:,}",
                f"{r['bytes_down']:,}",
                f"**{r['ratio']:.4f}**",
                f"{r['frames_per_step']:g}",
                f"{r['header_per_frame']:.0f}",
                "yes" if r["cut_equals_analytic"] and r["channel_equals_report"] else "**NO**",
                "met" if r["goal_met"] else "**not met**",
            ]
        )
    return (
        table(
            [
                "join",
                "labels at",
                "K",
                "aligned of each party's",
                "p",
                "steps",
                "q",
                "q_h",
                "analytic bytes",
                "measured up",
                "measured down",
                "ratio",
                "frames / step",
                "header bytes / frame",
                "tensor bytes = analytic",
                f"goal (≤ {GOAL_TRAFFIC:g})",
            ],
            rows,
        )
        + "\n\nOne epoch of BreastMNIST's training split"
        + (f" (a seeded random {part['train_limit']:,} of it)" if part.get("train_limit") else "")
        + " as `vertical_records` deals it "
        f"(each party lacks a different 10 %), batch {part['batch_size']}, codec `none`, "
        "`small_cnn`. Analytic: 2·p·K·q·b (+ 2·p·q_h·b with the labels at home; + 8·p "
        "labels up + 4 bytes of loss down a step with the labels at the server), b = 4; "
        "measured: the round report's bytes (the channel's decoded payloads agree, and "
        "their tensor bytes equal the analytic count exactly: *tensor bytes = analytic*); "
        "the excess is the frame headers. The PSI alignment before the first step is not "
        "in the round report (see the PSI section)."
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
    if "accuracy" in parts:
        out += ["**Accuracy**", markdown_accuracy(parts["accuracy"], result["date"])]
    if "traffic" in parts:
        out += [
            "**Traffic per epoch against the analytic cost**",
            markdown_traffic(parts["traffic"]),
        ]
    return "\n\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"from {', '.join(PARTS)}")
    parser.add_argument("--datasets", default=",".join(DATASETS), help="accuracy's datasets")
    parser.add_argument("--seeds", default="0,1,2", help="accuracy's seeds (the first: traffic)")
    parser.add_argument("--joins", default=",".join(JOINS), help="accuracy's joins")
    parser.add_argument("--epochs", type=int, help="accuracy's epochs for every dataset")
    parser.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="DATASET=N",
        help="train on a seeded random N of DATASET's training split (traffic too, for "
        "breastmnist)",
    )
    parser.add_argument("--model", default=Settings.model, help="accuracy's model")
    parser.add_argument("--lr", type=float, default=Settings.lr)
    parser.add_argument("--batch-size", type=int, default=Settings.batch_size)
    parser.add_argument(
        "--check-all-seeds",
        action="store_true",
        help="check every seed's job against the same model trained centrally (default: "
        "the first seed's)",
    )
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    args.datasets = [n.strip() for n in args.datasets.split(",") if n.strip()]
    args.joins = [j.strip() for j in args.joins.split(",") if j.strip()]
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if not args.parts or set(args.parts) - set(PARTS):
        parser.error(f"--parts: choose from {', '.join(PARTS)}")
    if not args.datasets or set(args.datasets) - set(DATASETS):
        parser.error(f"--datasets: choose from {', '.join(DATASETS)}")
    if not args.joins or set(args.joins) - set(JOINS):
        parser.error(f"--joins: choose from {', '.join(JOINS)}")
    if not args.seeds or min(args.seeds) < 0:
        parser.error("--seeds needs one or more integers >= 0")
    limits = {}
    for item in args.limit:
        name, _, n = item.partition("=")
        if name not in DATASETS or not n.isdigit() or int(n) < 1:
            parser.error(f"--limit {item!r}: give DATASET=N, DATASET from {', '.join(DATASETS)}")
        limits[name] = int(n)
    args.limit = limits
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    needed = set(args.datasets) if "accuracy" in args.parts else set()
    needed |= {"breastmnist"} if "traffic" in args.parts else set()
    for name in sorted(needed):
        path = args.data_dir / DATASETS[name][0]
        if not path.is_file():
            print(
                f"bench_vertical: {path} is missing; this benchmark needs the MedMNIST files "
                "in ../shared/data, or give --data-dir",
                file=sys.stderr,
            )
            return 2
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    parts: dict[str, Any] = {}
    for part in PARTS:
        if part not in args.parts:
            continue
        begun = time.perf_counter()
        parts[part] = measure_accuracy(args) if part == "accuracy" else measure_traffic(args)
        parts[part]["seconds"] = time.perf_counter() - begun
        say(f"{part} done in {parts[part]['seconds']:.0f} s")
    result = {
        "date": today(),
        "command": command_line("bench_vertical.py", argv),
        "parts": parts,
        "env": environment(),
        "seconds": time.perf_counter() - start,
    }
    print(json.dumps(result, indent=2) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
