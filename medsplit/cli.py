"""``medsplit``: price the cuts of a model, verify a cut, simulate a whole job, audit what
a cut leaks."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from medsplit.cutting import CutInfo, cut_table
from medsplit.data import DataSplit, load_medmnist, synthetic_segmentation_split, synthetic_split
from medsplit.defenses import PrivacyOptions
from medsplit.errors import ConfigError, MedSplitError
from medsplit.models import (
    build_any_model,
    get_model_spec,
    is_factory_name,
    model_names,
    parse_model_args,
)
from medsplit.models.factory import factory_module
from medsplit.modes import (
    DEFAULT_MODE,
    ModeOption,
    get_mode,
    load_extra_modes,
    mode_names,
    mode_paths,
)
from medsplit.privacy import AuditSettings, InversionSettings, audit_cut, format_report
from medsplit.protocol.optim import OPTIMIZERS, OptimizerConfig
from medsplit.training.augment import (
    TRANSFORMS,
    Augmentation,
    AugmentationError,
    check_augmentation,
)
from medsplit.training.config import TrainingConfig
from medsplit.training.evaluate import MajorityBaseline, majority_baseline
from medsplit.training.schedule import turn_length
from medsplit.training.simulate import (
    SimulationData,
    SimulationSetup,
    load_hospitals,
    num_classes_of,
    simulate,
)
from medsplit.training.split_job import RoundReport
from medsplit.training.tasks import DEFAULT_TASK, SEGMENTATION, TASKS
from medsplit.training.verify import verify_split, verify_vertical
from medsplit.training.vertical_simulate import MISSING_SHARE, VerticalRound, simulate_vertical
from medsplit.wire.codecs import CODECS

#: Extra modes the CLI registers, "package.module:ClassName" separated by commas.
EXTRA_MODES_ENV = "MEDSPLIT_EXTRA_MODES"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``medsplit`` console script."""
    try:
        # Before the parser: its --mode choices are the registered modes.
        load_extra_modes(mode_paths(os.environ.get(EXTRA_MODES_ENV)))
    except MedSplitError as e:
        print(f"medsplit: error: {EXTRA_MODES_ENV}: {e}", file=sys.stderr)
        return 2
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except MedSplitError as e:
        print(f"medsplit {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader (say, `| head`) left: stop quietly, and keep Python's own flush at
        # exit from failing on the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medsplit", description="Split learning for hospitals: the core tools."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    cuts = commands.add_parser("cuts", help="price every candidate cut of a model")
    cuts.add_argument("model", type=_model_name, help=_MODEL_HELP)
    _add_model_args(cuts)
    cuts.add_argument("--input-shape", type=_shape, help="C,H,W (default: the model's own)")
    cuts.add_argument("--classes", type=int, default=2)
    cuts.add_argument(
        "--depth",
        type=int,
        help="list every submodule at most this deep (default: as deep as the tensors "
        "crossing change, at most 200 cuts)",
    )
    cuts.add_argument("--json", action="store_true", help="a JSON list, one object per cut")
    cuts.set_defaults(run=_cuts)

    verify = commands.add_parser(
        "verify", help="train split and unsplit side by side; are all weights identical?"
    )
    verify.add_argument("model", type=_model_name, help=_MODEL_HELP)
    _add_model_args(verify)
    _add_cut_options(verify)
    verify.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    verify.add_argument("--hospitals", type=int, default=2, help="hospitals taking turns")
    verify.add_argument("--input-shape", type=_shape, help="C,H,W (default: the model's own)")
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(run=_verify)

    sim = commands.add_parser("simulate", help="run a whole split-learning job in this process")
    sim.add_argument(
        "--model",
        type=_model_name,
        help=f"{_MODEL_HELP}; default small_cnn, unet for --task segmentation",
    )
    _add_model_args(sim)
    _add_cut_options(sim)
    sim.add_argument(
        "--input-shape", type=_shape, help="C,H,W of synthetic images (default: the model's own)"
    )
    sim.add_argument("--hospitals", type=int, default=3)
    sim.add_argument("--data", type=Path, help="a MedMNIST .npz (default: synthetic images)")
    sim.add_argument("--samples", type=int, default=600, help="synthetic training images")
    sim.add_argument("--rounds", type=int, default=3)
    sim.add_argument("--local-epochs", type=int, default=10, help="per turn (default 10)")
    sim.add_argument("--max-steps-per-turn", type=int)
    sim.add_argument(
        "--schedule",
        default="cosine",
        choices=("constant", "cosine"),
        help="learning rate: constant, or cosine to zero over the job's steps (default)",
    )
    sim.add_argument("--json", action="store_true", help="print the round reports as JSON")
    # Defaults that learn on MedMNIST within the default 3 rounds (docs/benchmarks.md): with
    # SGD at lr 0.05 and one local epoch, BreastMNIST's 99 steps learn only the class prior.
    sim.set_defaults(
        run=_simulate,
        client_optimizer="adam",
        client_lr=0.002,
        server_optimizer="adam",
        server_lr=0.002,
    )

    privacy = commands.add_parser(
        "privacy",
        help="how much a cut leaks: inversion SSIM/PSNR, distance correlation, label leakage",
        description="Train the split briefly as a one-hospital job (--train-steps), then "
        "attack what crosses the first cut: an inverse network trained on the training "
        "split's (image, activation) pairs reconstructs the validation split (SSIM, PSNR); "
        "the distance correlation of inputs and activations; where the labels stay at the "
        "hospital (U-shaped), the norm and cosine attacks' AUC on the gradients it sent up.",
    )
    privacy.add_argument("model", type=_model_name, help=_MODEL_HELP)
    _add_model_args(privacy)
    _add_cut_options(privacy)
    privacy.add_argument(
        "--input-shape", type=_shape, help="C,H,W of synthetic images (default: the model's own)"
    )
    privacy.add_argument(
        "--data", type=Path, help="a MedMNIST .npz: its train and val splits (default: synthetic)"
    )
    privacy.add_argument("--samples", type=int, default=600, help="synthetic images (4/5 train)")
    privacy.add_argument(
        "--train-steps",
        type=int,
        default=100,
        help="split-training steps before the audit, so that the front attacked is a trained "
        "one (0: the initial front; default 100)",
    )
    privacy.add_argument(
        "--steps", type=int, default=300, help="the inverse network's training steps (300)"
    )
    privacy.add_argument(
        "--picture", type=Path, help="write originals beside reconstructions to this PNG"
    )
    privacy.add_argument(
        "--privacy",
        type=_privacy_options,
        default=None,
        help="the defenses to audit, as a job's privacy options (JSON), e.g. "
        '\'{"activation_noise": {"noise_multiplier": 1.0}}\' (default: none)',
    )
    privacy.add_argument("--json", action="store_true", help="the figures as one JSON object")
    privacy.set_defaults(
        run=_privacy,
        client_optimizer="adam",
        client_lr=0.002,
        server_optimizer="adam",
        server_lr=0.002,
    )
    return parser


_MODEL_HELP = (
    f"a registry model ({', '.join(model_names())}) or MODULE:FACTORY, a function or class "
    "called with --model-args (say monai.networks.nets:ViT)"
)


def _model_name(text: str) -> str:
    if is_factory_name(text):
        try:
            factory_module(text)
        except MedSplitError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text
    if text not in model_names():
        raise argparse.ArgumentTypeError(
            f"unknown model {text!r}: a registry model ({', '.join(model_names())}) or "
            "MODULE:FACTORY"
        )
    return text


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-args",
        metavar="JSON",
        help="keyword arguments of a MODULE:FACTORY model, a JSON object",
    )


def _build(
    args: argparse.Namespace, shape: tuple[int, ...], *, num_classes: int = 2, seed: int
) -> torch.nn.Module:
    """The model ``args`` name: the command line's own, so any module may be named."""
    return build_any_model(
        args.model,
        model_args=parse_model_args(args.model_args),
        spatial_dims=len(shape) - 1,
        in_channels=shape[0],
        num_classes=num_classes,
        seed=seed,
    )


def _input_shape(args: argparse.Namespace) -> tuple[int, ...]:
    if args.input_shape:
        return args.input_shape
    if is_factory_name(args.model):
        raise ConfigError(f"{args.model} has no default input shape: give --input-shape C,H,W")
    return get_model_spec(args.model).default_input_shape


def _add_cut_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", default=DEFAULT_MODE, choices=mode_names())
    _add_mode_options(parser)
    parser.add_argument(
        "--cut",
        action="append",
        help="submodule to cut after, once per cut the mode makes (default: the model's own)",
    )
    parser.add_argument("--codec", default="none", choices=sorted(CODECS))
    parser.add_argument(
        "--task",
        default=DEFAULT_TASK,
        choices=list(TASKS),
        help="classification (labels) or segmentation (masks; synthetic discs by default)",
    )
    parser.add_argument(
        "--loss",
        default="",
        help="one of the task's losses ("
        + "; ".join(f"{t.name}: {', '.join(t.losses)}" for t in TASKS.values())
        + "; default the first)",
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--client-optimizer", default="sgd", choices=OPTIMIZERS)
    parser.add_argument("--client-lr", type=float, default=0.05)
    parser.add_argument("--server-optimizer", default="sgd", choices=OPTIMIZERS)
    parser.add_argument("--server-lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--augment",
        type=_augmentation,
        default=(),
        metavar="JSON",
        help="MONAI random transforms on every training batch, drawn per step from the seed: "
        'a JSON list such as \'[{"name": "flip"}, {"name": "rotate", "degrees": 10}]\' '
        f"(transforms: {', '.join(TRANSFORMS)}; default: none)",
    )


def _augmentation(text: str) -> Augmentation:
    try:
        return check_augmentation(json.loads(text))
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): {text!r}") from None
    except AugmentationError as e:
        raise argparse.ArgumentTypeError(" / ".join(e.reasons)) from None


def _mode_options() -> dict[str, list[ModeOption]]:
    """Every registered mode's options, by name (modes may share an option's name)."""
    options: dict[str, list[ModeOption]] = {}
    for name in mode_names():
        for option in get_mode(name).options():
            options.setdefault(option.name, []).append(option)
    return options


def _add_mode_options(parser: argparse.ArgumentParser) -> None:
    """One ``--name`` per mode option, left unset unless given: the mode checks the value
    (and whether it takes the option at all) as a job's configuration would."""
    for name, options in _mode_options().items():
        modes = [m for m in mode_names() if any(o.name == name for o in get_mode(m).options())]
        choices = (
            sorted({c for o in options for c in o.choices})
            if all(o.choices for o in options)
            else None
        )
        kinds = {o.type for o in options}
        kind = kinds.pop() if len(kinds) == 1 else str
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=f"mode_option_{name}",
            type=_bool if kind is bool else kind,
            choices=choices,
            help=f"{options[0].help} ({', '.join(modes)} mode; default {options[0].default})",
        )


def _bool(text: str) -> bool:
    if text.lower() in ("true", "yes", "1"):
        return True
    if text.lower() in ("false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _given_mode_options(args: argparse.Namespace) -> dict[str, object]:
    prefix = "mode_option_"
    return {
        key[len(prefix) :]: value
        for key, value in vars(args).items()
        if key.startswith(prefix) and value is not None
    }


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected C,H,W (integers), got {text!r}") from None
    if len(shape) not in (3, 4) or min(shape) < 1:
        raise argparse.ArgumentTypeError(
            f"expected C,H,W or C,D,H,W of positive sizes, got {text!r}"
        )
    return shape


def _training_config(
    args: argparse.Namespace,
    model: str,
    *,
    schedule: str = "constant",
    total_steps: int = 1000,
    **overrides: object,
) -> TrainingConfig:
    if not is_factory_name(model) and args.task not in get_model_spec(model).tasks:
        tasks = " / ".join(get_model_spec(model).tasks)
        raise ConfigError(f"{model} is a {tasks} model: give --task {tasks.split(' / ')[0]}")
    options = _given_mode_options(args)
    # Bound to its options: they may change the mode's cuts (SplitFed's labels).
    mode = get_mode(args.mode).with_options(options)
    if args.cut:
        cuts = tuple(args.cut)
    elif is_factory_name(model):
        raise ConfigError(f"{model} has no default cut: give --cut (see `medsplit cuts {model}`)")
    else:
        cuts = mode.default_cuts(get_model_spec(model))

    def optimizer(name: str, lr: float) -> OptimizerConfig:
        momentum = args.momentum if name == "sgd" else 0.0
        return OptimizerConfig(
            name=name, lr=lr, momentum=momentum, schedule=schedule, total_steps=total_steps
        )

    return TrainingConfig(
        cuts=cuts,
        mode=mode.name,
        mode_options=options,
        client_optimizer=optimizer(args.client_optimizer, args.client_lr),
        server_optimizer=optimizer(args.server_optimizer, args.server_lr),
        batch_size=args.batch_size,
        codec=args.codec,
        seed=args.seed,
        task=args.task,
        loss=args.loss,
        augmentation=args.augment,
        **overrides,
    )


def _cuts(args: argparse.Namespace) -> int:
    shape = _input_shape(args)
    model = _build(args, shape, num_classes=args.classes, seed=0)
    rows = cut_table(model, torch.zeros(1, *shape), depth=args.depth)
    if args.json:
        print(json.dumps([row.to_json() for row in rows], indent=2))
    else:
        about = (
            type(model).__name__
            if is_factory_name(args.model)
            else get_model_spec(args.model).description
        )
        print(f"{args.model} at input {','.join(map(str, shape))}: {about}")
        print(_format_cut_table(rows))
    if rows.note:
        print(f"note: {rows.note}", file=sys.stderr)
    return 0


def _format_cut_table(rows: list[CutInfo]) -> str:
    header = ("cut", "client params", "share", "client MFLOPs", "values", "KiB", "crossing")
    lines = [header]
    for r in rows:
        lines.append(
            (
                r.name,
                f"{r.client_params:,}",
                f"{100 * r.client_param_share:.1f}%",
                f"{r.client_flops_per_sample / 1e6:,.1f}",
                f"{r.values_per_sample:,}",
                f"{r.bytes_per_sample / 1024:,.1f}",
                ", ".join(t.name for t in r.crossing),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for line in lines:
        cells = [line[0].ljust(widths[0])]
        cells += [cell.rjust(w) for cell, w in zip(line[1:-1], widths[1:-1], strict=True)]
        cells.append(line[-1])
        out.append("  ".join(cells))
    out.insert(1, "-" * len(out[0]))
    return "\n".join(out) + "\n(per sample; FLOPs count convolutions and matrix products)"


def _verify(args: argparse.Namespace) -> int:
    shape = _input_shape(args)
    if args.steps < 1 or args.hospitals < 1:
        print("medsplit verify: error: --steps and --hospitals must be at least 1", file=sys.stderr)
        return 2
    probe = _training_config(args, args.model)
    # Parties holding different features of the same records all take every step.
    vertical = probe.split_mode.feature_sets
    per_turn = args.steps if vertical else math.ceil(args.steps / args.hospitals)
    config = _training_config(args, args.model, max_steps_per_turn=per_turn)
    segmentation = config.task == SEGMENTATION
    model = _build(args, shape, seed=args.seed)
    if vertical and segmentation:
        print(
            "medsplit verify: error: a vertical job classifies (no segmentation)", file=sys.stderr
        )
        return 2
    if vertical:
        if args.hospitals < 2:
            print(
                "medsplit verify: error: a vertical job needs --hospitals 2 or more",
                file=sys.stderr,
            )
            return 2
        data = synthetic_split(per_turn * args.batch_size, shape=shape, seed=args.seed)
        report = verify_vertical(
            model, data, config, parties=args.hospitals, progress=not args.json
        )
    else:
        make = synthetic_segmentation_split if segmentation else synthetic_split
        data = make(per_turn * args.batch_size * args.hospitals, shape=shape, seed=args.seed)
        splits = [
            type(data)(data.images[i :: args.hospitals], data.labels[i :: args.hospitals])
            for i in range(args.hospitals)
        ]
        report = verify_split(model, splits, config, progress=not args.json)
    if args.json:
        print(json.dumps(report.to_json()))
    elif report.exact:
        print(
            f"exact: {report.compared} tensors identical after {report.steps} steps "
            f"({_mode_label(config)}, cut {' / '.join(config.cuts)}, codec {config.codec})"
        )
    else:
        print(
            f"NOT exact after {report.steps} steps: first difference in "
            f"{report.first_difference!r} (max |diff| {report.max_abs_difference})"
        )
    return 0 if report.exact else 1


def _simulate(args: argparse.Namespace) -> int:
    if args.model is None:
        args.model = "unet" if args.task == SEGMENTATION else "small_cnn"
    setup = SimulationSetup(
        model=args.model,
        model_args=parse_model_args(args.model_args),
        hospitals=args.hospitals,
        data=SimulationData(
            medmnist=args.data,
            synthetic_samples=args.samples,
            synthetic_shape=_input_shape(args) if args.data is None else (1, 28, 28),
            task=args.task,
        ),
    )
    overrides = dict(
        rounds=args.rounds,
        local_epochs=args.local_epochs,
        max_steps_per_turn=args.max_steps_per_turn,
    )
    hospitals = load_hospitals(setup, seed=args.seed)
    probe = _training_config(args, args.model, **overrides)
    total_steps = max(1, args.rounds * sum(turn_length(probe, len(h.train)) for h in hospitals))
    if probe.split_mode.feature_sets:
        # Every party takes every step, over the records all of them hold.
        records = sum(len(h.train) for h in hospitals)
        aligned = records - args.hospitals * int(records * MISSING_SHARE)
        total_steps = max(1, args.rounds * turn_length(probe, aligned))
    config = _training_config(
        args, args.model, schedule=args.schedule, total_steps=total_steps, **overrides
    )
    # What always answering the training data's most common class scores on validation.
    baseline = majority_baseline(
        torch.cat([h.train.labels for h in hospitals]),
        torch.cat([h.val.labels for h in hospitals if h.val is not None]),
    )
    source = args.data or f"{args.samples} synthetic images"
    if config.task == SEGMENTATION:
        source = f"{args.samples} synthetic images with masks (MONAI's discs)"
    if config.split_mode.feature_sets:
        return _simulate_vertical(args, setup, config, baseline, source)
    print(
        f"simulating {args.hospitals} hospitals on {source}: {args.model}, {_mode_label(config)} "
        f"mode, cut {' / '.join(config.cuts)}, codec {config.codec}, {config.rounds} rounds",
        file=sys.stderr,
    )
    reports = simulate(
        setup,
        config,
        progress=not args.json,
        on_round=None if args.json else lambda report: _print_round(report, baseline),
    )
    if args.json:
        print(json.dumps([_round_json(r, baseline) for r in reports], indent=2))
    return 0


def _simulate_vertical(
    args: argparse.Namespace,
    setup: SimulationSetup,
    config: TrainingConfig,
    baseline: MajorityBaseline,
    source: object,
) -> int:
    print(
        f"simulating {args.hospitals} parties holding bands of each image of {source}: "
        f"{args.model}, {_mode_label(config)} mode, cut {' / '.join(config.cuts)}, codec "
        f"{config.codec}, {config.rounds} rounds; records aligned by private set intersection",
        file=sys.stderr,
    )

    def show(done: VerticalRound) -> None:
        r, val = done.report, done.validation
        leakage = "; ".join(
            f"{party}: norm AUC {_auc(a.get('norm_auc'))}, cosine AUC {_auc(a.get('cosine_auc'))}"
            for party, a in r.leakage.items()
        )
        print(
            f"round {r.round + 1}: train loss {r.mean_loss:.4f}, val accuracy "
            f"{val.get('val_accuracy', float('nan')):.3f} ({baseline.describe()}), val AUC "
            f"{_auc(val.get('val_auc'))}, crossed {r.bytes_up / 2**20:.2f} MiB up, "
            f"{r.bytes_down / 2**20:.2f} MiB down in {r.steps} steps; label leakage "
            f"({leakage})",
            flush=True,
        )

    rounds = simulate_vertical(
        setup, config, progress=not args.json, on_round=None if args.json else show
    )
    if args.json:
        out = []
        for done in rounds:
            row = _round_json(done.report, baseline)
            row["validation"] = done.validation
            row["label_leakage"] = done.report.leakage
            out.append(row)
        print(json.dumps(out, indent=2))
    return 0


def _privacy_options(text: str) -> PrivacyOptions:
    try:
        return PrivacyOptions.from_json(json.loads(text))
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--privacy is not JSON: {e}") from e
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _privacy(args: argparse.Namespace) -> int:
    if args.train_steps < 0 or args.steps < 1 or args.samples < 10:
        raise ConfigError("--train-steps must be >= 0, --steps >= 1 and --samples >= 10")
    if args.data is not None:
        train, val = load_medmnist(args.data, "train"), load_medmnist(args.data, "val")
        source = str(args.data)
    else:
        pool = synthetic_split(args.samples, shape=_input_shape(args), seed=args.seed)
        cut = len(pool) * 4 // 5
        train = DataSplit(pool.images[:cut], pool.labels[:cut])
        val = DataSplit(pool.images[cut:], pool.labels[cut:])
        source = f"{args.samples} synthetic images"
    shape = tuple(train.images.shape[1:])
    model = _build(args, shape, num_classes=num_classes_of([train, val]), seed=args.seed)
    settings = AuditSettings(
        train_steps=args.train_steps,
        inversion=InversionSettings(steps=args.steps, seed=args.seed),
        picture=args.picture,
    )
    config = _training_config(args, args.model)
    if args.privacy is not None:
        config = dataclasses.replace(config, privacy=args.privacy)  # checked against the mode
    report = audit_cut(model, train, val, config, settings, model_name=args.model)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(format_report(report, source=source))
    return 0


def _auc(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _mode_label(config: TrainingConfig) -> str:
    """The mode's name with its options, if it takes any (``splitfed variant=v2 ...``)."""
    options = " ".join(f"{k}={v}" for k, v in config.mode_options.items())
    return f"{config.mode} {options}" if options else config.mode


def _print_round(report: RoundReport, baseline: MajorityBaseline) -> None:
    val = report.validation
    accuracy = (
        sum(e.accuracy * e.samples for e in val.values()) / sum(e.samples for e in val.values())
        if val
        else float("nan")
    )
    if any(e.dice is not None for e in val.values()):
        dice = sum(e.metric * e.samples for e in val.values()) / sum(
            e.samples for e in val.values()
        )
        per_hospital = ", ".join(f"{name} {e.metric:.3f}" for name, e in val.items())
        scores = f"val Dice {dice:.3f} ({per_hospital}; foreground classes, mean)"
    else:
        per_hospital = ", ".join(f"{name} {e.accuracy:.3f}" for name, e in val.items())
        scores = f"val accuracy {accuracy:.3f} ({per_hospital}; {baseline.describe()})"
    print(
        f"round {report.round + 1}: train loss {report.mean_loss:.4f}, {scores}, "
        f"crossed {report.bytes_up / 2**20:.2f} MiB up, {report.bytes_down / 2**20:.2f} MiB down "
        f"in {report.steps} steps",
        flush=True,
    )


def _round_json(report: RoundReport, baseline: MajorityBaseline) -> dict[str, object]:
    return {
        "round": report.round,
        "steps": report.steps,
        "samples": report.samples,
        "train_loss": report.mean_loss,
        "bytes_up": report.bytes_up,
        "bytes_down": report.bytes_down,
        "validation": {
            name: {"loss": e.loss, "accuracy": e.accuracy, "samples": e.samples}
            | ({"dice": e.dice} if e.dice is not None else {})
            for name, e in report.validation.items()
        },
        "val_majority_baseline": baseline.accuracy,
    }


if __name__ == "__main__":
    raise SystemExit(main())
