"""``medsplit-agent``: run the agent, check its configuration and data offline, or show
its status (identity and pinned fingerprints) offline."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

from hospital_agent import __version__
from hospital_agent.config import AgentConfig, add_config_flags, config_flags, load_config
from hospital_agent.data import DataProblem, check_data
from hospital_agent.service import EXIT_CONFIG, Agent
from hospital_agent.status import render, status_lines
from medsplit.errors import ConfigError


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
        choices=["run", "check", "status"],
        help="run (default): take part in jobs; check: validate the configuration "
        "and the data without contacting anyone; status: this agent's hospital, identity "
        "fingerprint and the fingerprints it pinned for its peers, from its work directory",
    )
    p.add_argument("--config", metavar="FILE", help="a TOML file; its keys are listed below")
    p.add_argument(
        "--log-level",
        default=os.environ.get("MEDSPLIT_AGENT_LOG_LEVEL", "INFO"),
        metavar="LEVEL",
        help="DEBUG, INFO, WARNING or ERROR (MEDSPLIT_AGENT_LOG_LEVEL; default INFO)",
    )
    # Every configuration key gets its flag from the one table in config.py.
    add_config_flags(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``medsplit-agent`` with ``argv``; returns the exit code."""
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(file=args.config, flags=config_flags(args), env=os.environ)
    except ConfigError as e:
        print(f"medsplit-agent: {e}", file=sys.stderr)
        return EXIT_CONFIG
    if args.command == "check":
        return check(config)
    if args.command == "status":
        return status(config)
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


if __name__ == "__main__":
    sys.exit(main())
