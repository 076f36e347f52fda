"""``medsplit-agent``: run the agent, check its configuration and data offline, show its
status (identity and pinned fingerprints) offline, audit a cut's privacy on its own data,
predict on images through a completed job's final model, or answer and fetch a model
export (by every participating hospital's consent)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from hospital_agent import __version__
from hospital_agent.config import AgentConfig, add_config_flags, config_flags, load_config
from hospital_agent.coordinator import CoordinatorError
from hospital_agent.data import DataProblem, check_data
from hospital_agent.export_flow import approve_export, fetch_export, refuse_export
from hospital_agent.predict import PredictRequest, check_request
from hospital_agent.predict import predict as run_predict
from hospital_agent.privacy_audit import AuditRequest, run_privacy_audit
from hospital_agent.service import EXIT_CONFIG, Agent
from hospital_agent.status import render, status_lines
from medsplit.errors import ConfigError, MedSplitError
from medsplit.modes import DEFAULT_MODE
from medsplit.privacy import format_report


def parser() -> argparse.ArgumentParser:
    """The command line of ``medsplit-agent``: a command, its options and a flag per key."""
    p = argparse.ArgumentParser(
        prog="medsplit-agent",
        description="A hospital's MedSplit agent: takes its turns in split-learning jobs "
        "on local images; only activations and sealed weights leave the hospital.",
    )
    p.add_argument("--version", action="version", version=f"medsplit-agent {__version__}")
    p.add_argument(
        "command",
        nargs="?",
        default="run",
        choices=[
            "run",
            "check",
            "status",
            "privacy-audit",
            "predict",
            "approve-export",
            "refuse-export",
            "fetch-export",
        ],
        help="run (default): take part in jobs; check: validate the configuration "
        "and the data without contacting anyone; status: this agent's hospital, identity "
        "fingerprint and the fingerprints it pinned for its peers, from its work directory; "
        "privacy-audit: how much a cut of --model leaks on this hospital's own data "
        "(offline; figures and a picture grid go to the work directory's privacy/); "
        "predict: a completed job's final model on the image PATHs, through the split "
        "(a CSV of predictions; masks too for segmentation), or a vertical job's on the "
        "records of --ids FILE; approve-export / "
        "refuse-export --export N: this hospital's answer to a model export (once every "
        "hospital approved, a sender seals its segments to the receiver); fetch-export "
        "--export N --out DIR: the receiver assembles the whole model and checks it",
    )
    p.add_argument("paths", nargs="*", metavar="PATH", help="predict: the images")
    p.add_argument("--config", metavar="FILE", help="a TOML file; its keys are listed below")
    p.add_argument(
        "--log-level",
        default=os.environ.get("MEDSPLIT_AGENT_LOG_LEVEL", "INFO"),
        metavar="LEVEL",
        help="DEBUG, INFO, WARNING or ERROR (MEDSPLIT_AGENT_LOG_LEVEL; default INFO)",
    )
    _add_audit_flags(p)
    predict = p.add_argument_group("predict", "the job and where the predictions go")
    predict.add_argument("--job", type=int, help="the completed job's id")
    predict.add_argument(
        "--ids",
        metavar="FILE",
        help="a vertical job (at its label party): the record identifiers to predict on, "
        "one a line in the first CSV column, no header; every party's agent answers",
    )
    predict.add_argument(
        "--out",
        help="the CSV to write (default: <work_dir>/predictions/job-N.csv; a segmentation "
        "job's masks go to a folder beside it, <name>_masks/)",
    )
    export = p.add_argument_group("approve-export, refuse-export, fetch-export")
    export.add_argument("--export", type=int, help="the export's id")
    export.add_argument("--reason", help="refuse-export: why (the other hospitals see it)")
    export.add_argument(
        "--wait",
        type=float,
        default=600.0,
        help="seconds to wait for every approval (and, fetch-export, every part; default 600)",
    )
    # Every configuration key gets its flag from the one table in config.py.
    add_config_flags(p)
    return p


def _add_audit_flags(p: argparse.ArgumentParser) -> None:
    audit = p.add_argument_group("privacy-audit", "the model and cut to audit")
    audit.add_argument("--model", help="a registry model, or MODULE:FACTORY in model_modules")
    audit.add_argument("--cut", action="append", help="once per cut (default: the model's)")
    audit.add_argument(
        "--mode", default=DEFAULT_MODE, help=f"the job's mode (default {DEFAULT_MODE})"
    )
    audit.add_argument("--input-shape", help="C,H,W the images are resized to")
    audit.add_argument("--classes", type=int, default=2, help="the job's classes (default 2)")
    audit.add_argument(
        "--train-steps", type=int, default=100, help="split-training steps first (default 100)"
    )
    audit.add_argument(
        "--decoder-steps", type=int, default=300, help="inverse network steps (default 300)"
    )
    audit.add_argument("--batch-size", type=int, default=32)
    audit.add_argument("--seed", type=int, default=0)
    audit.add_argument("--json", action="store_true", help="print the figures as JSON")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``medsplit-agent`` with ``argv``; returns the exit code."""
    # Intermixed: `predict --job N PATH...` has its paths after the options.
    args = parser().parse_intermixed_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.paths and args.command != "predict":
        print(f"medsplit-agent: {args.command} takes no PATH (only predict does)", file=sys.stderr)
        return EXIT_CONFIG
    try:
        config = load_config(file=args.config, flags=config_flags(args), env=os.environ)
    except ConfigError as e:
        print(f"medsplit-agent: {e}", file=sys.stderr)
        return EXIT_CONFIG
    if args.command == "check":
        return check(config)
    if args.command == "status":
        return status(config)
    if args.command == "privacy-audit":
        return privacy_audit(config, args)
    if args.command == "predict":
        return predict(config, args)
    if args.command.endswith("-export"):
        return export_command(config, args)
    return Agent(config).run()


def check(config: AgentConfig) -> int:
    """Validate the configuration and the data, print the dataset summary."""
    try:
        summary = check_data(config.data, val_fraction=config.val_fraction, seed=config.split_seed)
    except DataProblem as e:
        print(f"medsplit-agent: the data cannot be used: {e}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"configuration OK (coordinator {config.coordinator_url}, work dir {config.work_dir})")
    print(json.dumps(summary.to_json(), indent=2))
    return 0


def status(config: AgentConfig) -> int:
    """Print the agent's status lines (offline: only its work directory is read)."""
    try:
        lines = status_lines(config)
    except ConfigError as e:
        print(f"medsplit-agent: {e}", file=sys.stderr)
        return EXIT_CONFIG
    print(render(lines))
    return 0


def privacy_audit(config: AgentConfig, args: argparse.Namespace) -> int:
    """Audit a cut on the hospital's own data; print the figures (nothing is sent)."""
    try:
        if not args.model:
            raise ConfigError("privacy-audit needs --model (and --cut unless the model's own)")
        shape = _shape(args.input_shape) if args.input_shape else None
        request = AuditRequest(
            model=args.model,
            cuts=tuple(args.cut or ()),
            mode=args.mode,
            input_shape=shape,
            num_classes=args.classes,
            train_steps=args.train_steps,
            decoder_steps=args.decoder_steps,
            batch_size=args.batch_size,
            seed=args.seed,
        )
        outcome = run_privacy_audit(config, request)
    except MedSplitError as e:
        print(f"medsplit-agent privacy-audit: {e}", file=sys.stderr)
        return EXIT_CONFIG
    if args.json:
        print(json.dumps(outcome.report.to_json(), indent=2))
    else:
        print(format_report(outcome.report, source=f"this hospital's {config.data.kind} data"))
        print(f"figures: {outcome.figures}")
    return 0


def predict(config: AgentConfig, args: argparse.Namespace) -> int:
    """Predict on the images through the job's final model; one line on failure."""
    # MONAI logs each reader that could not open a file; the one line below says which.
    logging.getLogger("LoadImage").setLevel(logging.WARNING)
    try:
        check_request(args.job, args.paths, args.ids)
        written = run_predict(
            config,
            PredictRequest(
                job=args.job,
                paths=tuple(args.paths),
                out=Path(args.out) if args.out else None,
                ids=Path(args.ids) if args.ids else None,
            ),
        )
    except (MedSplitError, CoordinatorError) as e:
        print(f"medsplit-agent predict: {e}", file=sys.stderr)
        return EXIT_CONFIG
    masks = f"; masks in {written.masks}" if written.masks is not None else ""
    print(f"{written.samples} predictions written to {written.csv}{masks}")
    return 0


def export_command(config: AgentConfig, args: argparse.Namespace) -> int:
    """approve-export, refuse-export or fetch-export; one line either way."""
    try:
        if args.export is None:
            raise ConfigError(f"{args.command} needs --export N")
        if args.command == "approve-export":
            print(approve_export(config, args.export, wait=args.wait))
        elif args.command == "refuse-export":
            print(refuse_export(config, args.export, reason=args.reason or ""))
        else:
            if not args.out:
                raise ConfigError("fetch-export needs --out DIR (a new or empty folder)")
            done = fetch_export(config, args.export, Path(args.out), wait=args.wait)
            print(
                f"export {args.export}: {done.parts} parts opened ({done.size_bytes} bytes), "
                f"the model equals the split model on {done.checked_images} images; written "
                f"to {done.out}"
            )
    except (MedSplitError, CoordinatorError) as e:
        print(f"medsplit-agent {args.command}: {e}", file=sys.stderr)
        return EXIT_CONFIG
    return 0


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(f"--input-shape must be C,H,W (integers), got {text!r}") from None
    if len(shape) not in (3, 4) or min(shape) < 1:
        raise ConfigError(f"--input-shape must be C,H,W or C,D,H,W of positive sizes: {text!r}")
    return shape


if __name__ == "__main__":
    sys.exit(main())
