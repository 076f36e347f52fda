"""The parts of ``bench_overhead.py`` and ``bench_scaling.py`` that need no platform: the
agent's per-step stamps are read back from its log, and each script's ``markdown``
renders a result (the date, the command, the goal, a model that does not run)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import bench_overhead  # noqa: E402
import bench_scaling  # noqa: E402
import report  # noqa: E402
from platform_setup import AGENT_PROGRESS_ENV, step_stamps  # noqa: E402


def test_step_stamps_take_the_first_print_of_each_step_per_turn() -> None:
    assert AGENT_PROGRESS_ENV["TQDM_BAR_FORMAT"].startswith("@@step {n} ")
    log = (
        "\r@@step 0 0.000000@@2026-11-30 10:00:00,000 INFO x: job 5 round 0: my turn\n"
        "\r@@step 1 0.500000@@\r@@step 1 0.500100@@\r@@step 2 0.900000@@\r@@step 2 0.9001@@"
        "\r                  \r2026-11-30 10:00:01,000 INFO x: turn done\n"
        "\r@@step 0 0.000000@@\r@@step 1 0.250000@@\r"
    )
    assert step_stamps(log) == [[0.5, 0.9], [0.25]]


def test_agent_turns_read_times_and_stamps_per_job_and_round() -> None:
    log = (
        "2026-11-30 09:59:59,000 INFO hospital_agent.turns: job 5 round 1: turn 9 assigned\n"
        "2026-11-30 09:59:59,800 INFO hospital_agent.turns: job 5 round 1: start state ready\n"
        "\r@@step 0 0.000000@@2026-11-30 10:00:00,000 INFO hospital_agent.turns: "
        "job 5 round 1: my turn (2 training steps, 0 validation batches)\n"
        "\r@@step 1 0.500000@@\r@@step 2 0.900000@@\r2026-11-30 10:00:01,250 INFO "
        "hospital_agent.turns: turn done: train_loss 0.5; per step 1.0 ms waiting on the "
        "relay, 2.0 ms computing; peak memory 300 MiB\n"
        "2026-11-30 10:00:01,500 INFO hospital_agent.turns: job 5: weights sealed for 2 "
        "other participant(s)\n"
    )
    turn = bench_scaling.agent_turns(log)[5, 1]
    assert turn["stamps"] == [0.5, 0.9] and turn["recipients"] == 2
    assert (turn["sealed"] - turn["done"]).total_seconds() == 0.25
    assert turn["my_turn"] < datetime.now(UTC)  # aware, comparable with the database's times
    assert (turn["ready"] - turn["assigned"]).total_seconds() == 0.8
    assert (turn["my_turn"] - turn["ready"]).total_seconds() == 0.2
    # The first step answered: the bar is made just after "start state ready".
    assert (bench_scaling._answered(turn, 0) - turn["ready"]).total_seconds() == 0.5


def test_overhead_markdown_shows_goal_and_a_model_that_does_not_run() -> None:
    step = {"steps": 20, "median_s": 0.5, "mean_s": 0.55, "min_s": 0.4, "max_s": 0.9}
    measured = {
        "model": "resnet18",
        "input_shape": [1, 28, 28],
        "cut": "layer1",
        "runnable": True,
        "unsplit": step,
        "platform": {**step, "median_s": 0.55},
        "ratio_median": 1.1,
        "ratio_mean": 1.0,
        "same_weights_as_unsplit": True,
        "bytes_per_step": 1000.0,
        "scheduled_to_agent_turn_s": 5.0,
        "load_average": [1.0, 2.0],
    }
    refused = {
        "model": "densenet121",
        "input_shape": [1, 28, 28],
        "cut": "features.transition1",
        "runnable": False,
        "reason": "DenseNet121 does not run on an input of shape [2, 1, 28, 28]",
    }
    result = {
        "command": ".venv/bin/python bench/bench_overhead.py",
        "batch_size": 32,
        "warmup_steps": 3,
        "timed_steps": 20,
        "threads": 2,
        "deterministic": False,
        "cpus": 2,
        "torch": "2",
        "goal": 1.15,
        "models": [refused, measured],
    }
    text = bench_overhead.markdown(result)
    assert report.today() in text and "bench/bench_overhead.py" in text
    assert "not runnable: DenseNet121 does not run" in text
    assert "**1.100**" in text and "≤ 1.15" in text


def test_scaling_markdown_shows_rounds_and_turn_phases() -> None:
    phases = {
        "period_s": 2.0,
        "pickup_s": 0.5,
        "steps_s": 1.0,
        "step_median_s": 0.1,
        "handshake_end_s": 0.3,
        "scheduling_s": 0.2,
        "sealing_s": 0.05,
    }
    handover = {key: 0.05 for key, _ in bench_scaling.HANDOVER_PHASES} | {"total_s": 0.3}
    configs = [
        {
            "hospitals": n,
            "round_wall_s": [2.0 * n],
            "round_wall_median_s": 2.0 * n,
            "per_turn_s": 2.0,
            "ratio_to_base": float(n),
            "ratio_per_hospital": 1.0,
            "phases": phases,
            "step_median_s": 0.1,
            "handovers": [handover, {**handover, "total_s": 0.9}],
            "handover": handover,
            "create_to_first_step_s": 2.5,
        }
        for n in (1, 3)
    ]
    result = {
        "command": ".venv/bin/python bench/bench_scaling.py",
        "model": "small_cnn",
        "batch_size": 32,
        "steps_per_turn": 10,
        "rounds": 2,
        "agents": 3,
        "samples_per_agent": [470, 471],
        "data": "PneumoniaMNIST",
        "threads": 2,
        "cpus": 2,
        "torch": "2",
        "agent_rss_bytes": {"max": 400 << 20, "total": 1200 << 20},
        "agent_hwm_bytes": {"max": 410 << 20, "total": 1230 << 20},
        "load_average": [1.0, 1.0, 1.0],
        "configurations": configs,
    }
    text = bench_scaling.markdown(result)
    assert report.today() in text and "bench/bench_scaling.py" in text
    assert "**3.00**" in text and "**1.00 s**" in text
    assert "**300 ms** (300–900)" in text and "**3.0**" in text and "2.50 s" in text
