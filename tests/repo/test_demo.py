"""The README's demo (``scripts/demo.py``, after ``scripts/demo`` installed everything).

Its arguments are checked before anything starts (bad ``--data`` and ``--work-dir`` are
one-line errors, exit code 2, nothing touched). One real run on the shared Redis
(``REDIS_URL`` set) is shared by this module's tests: every key and ACL user it makes
there carries its prefix, and Ctrl-C during its job exits 130 and leaves neither a
process nor a key nor a user behind. The run with ``REDIS_URL`` unset is
``tests/frontend/test_demo_run.py``'s, which also checks the dashboard, the results
printed beside the baseline, staying up after the job, and Ctrl-C then (exit 0). A
``--task segmentation`` run (a unet on PNG folders of images and masks) has a test of its own.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from medsplit.cli import main as medsplit_main
from tests.demo_run import QUICK, REPO, DemoRun, still_running
from tests.redis_server import DEFAULT_URL, reachable


def _demo_module():
    spec = importlib.util.spec_from_file_location("medsplit_demo_script", REPO / "scripts/demo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _demo_process_exits(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``scripts/demo.py`` run as a process, to its exit."""
    return subprocess.run(
        [sys.executable, "scripts/demo.py", "--exit-when-done", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _demo_exits(*args: str) -> subprocess.CompletedProcess[str]:
    """The demo's ``main`` called here, for the arguments it refuses before starting
    anything: what a process would give (exit code, stdout, stderr) without a new
    interpreter importing everything for each refusal. The entry point itself
    (``sys.exit(main())``) is run as a process by the taken-port test."""
    demo = _demo_module()
    argv = ["--exit-when-done", *args]
    out, err = io.StringIO(), io.StringIO()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = demo.main(argv)
            except SystemExit as e:  # argparse's refusals
                code = e.code
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


# -- bad --data: medsplit simulate's checks and messages, exit 2 --------------------------


def _missing(path: Path) -> Path:
    return path / "not-here.npz"


def _truncated(path: Path) -> Path:
    whole = path / "whole.npz"
    rng = np.random.default_rng(0)
    arrays = {
        f"{split}_{kind}": rng.integers(0, 256, (20, 28, 28), dtype=np.uint8)
        if kind == "images"
        else rng.integers(0, 2, (20, 1))
        for split in ("train", "val", "test")
        for kind in ("images", "labels")
    }
    np.savez(whole, **arrays)
    cut = path / "truncated.npz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    return cut


def _random_bytes(path: Path) -> Path:
    noise = path / "noise.npz"
    noise.write_bytes(np.random.default_rng(1).bytes(4096))
    return noise


def _wrong_keys(path: Path) -> Path:
    other = path / "other.npz"
    np.savez(other, x=np.zeros((3, 28, 28), np.uint8), y=np.zeros(3, np.int64))
    return other


@pytest.mark.parametrize("make", [_missing, _truncated, _random_bytes, _wrong_keys])
def test_bad_data_is_simulates_one_line_error_with_exit_code_2(
    make, tmp_path: Path, capsys
) -> None:
    data = make(tmp_path)
    assert medsplit_main(["simulate", "--data", str(data), "--json"]) == 2
    simulate_err = capsys.readouterr().err.strip()
    assert simulate_err.startswith("medsplit simulate: error: ")
    message = simulate_err.removeprefix("medsplit simulate: error: ")
    work = tmp_path / "work"
    done = _demo_exits("--data", str(data), "--work-dir", str(work))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == f"medsplit demo: error: {message}"
    assert "Traceback" not in done.stdout + done.stderr
    assert "pickled" not in done.stderr  # numpy's misleading word never reaches the user
    assert not work.exists(), "nothing is made before the data is known to be good"


# -- --work-dir: never deletes what the demo did not make ----------------------------------


def test_a_non_empty_folder_that_is_not_a_demos_is_refused_untouched(tmp_path: Path) -> None:
    work = tmp_path / "mine"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    done = _demo_exits("--work-dir", str(work))
    assert done.returncode == 2, done.stdout + done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"medsplit demo: error: --work-dir {work} is not empty")
    assert "not a previous demo's" in line
    assert [p.name for p in work.iterdir()] == ["notes.txt"]
    assert (work / "notes.txt").read_text() == "mine"


def test_a_file_as_work_dir_is_refused(tmp_path: Path) -> None:
    work = tmp_path / "file"
    work.write_text("x")
    done = _demo_exits("--work-dir", str(work))
    assert done.returncode == 2
    assert done.stderr.strip() == f"medsplit demo: error: --work-dir {work}: not a folder"
    assert work.read_text() == "x"


def test_a_previous_demos_folder_loses_only_what_that_demo_made(tmp_path: Path) -> None:
    demo = _demo_module()
    work = tmp_path / "demo"
    first = demo.WorkDir.claim(work)
    first.entry("agent-0").mkdir()
    (work / "agent-0" / "key").write_text("k")
    first.entry("worker.log").write_text("log")
    (work / "mine.txt").write_text("put here by hand")
    (tmp_path / "outside").write_text("o")
    marker = json.loads((work / demo.MARKER).read_text())
    assert marker["made"] == ["agent-0", "worker.log"]
    # A marker edited to point elsewhere reaches nothing outside the folder.
    marker["made"] += ["../outside", "/etc", ".."]
    (work / demo.MARKER).write_text(json.dumps(marker))

    second = demo.WorkDir.claim(work)
    assert sorted(p.name for p in work.iterdir()) == [demo.MARKER, "mine.txt"]
    assert (work / "mine.txt").read_text() == "put here by hand"
    assert (tmp_path / "outside").read_text() == "o"
    assert second.made == []


def test_an_empty_folder_is_taken(tmp_path: Path) -> None:
    demo = _demo_module()
    work = tmp_path / "empty"
    work.mkdir()
    demo.WorkDir.claim(work)
    assert [p.name for p in work.iterdir()] == [demo.MARKER]


def test_a_taken_port_is_a_one_line_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = _demo_process_exits("--port", str(port), "--work-dir", str(tmp_path / "w"))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"medsplit demo: error: port {port} is taken: give another with --port"
    )


# -- one run on the shared Redis -----------------------------------------------------------


@pytest.fixture(scope="module")
def shared_redis() -> Iterator[redis.Redis]:
    if not reachable(DEFAULT_URL):
        pytest.skip(f"no Redis at {DEFAULT_URL} to share")
    client = redis.Redis.from_url(DEFAULT_URL, socket_timeout=10)
    yield client
    client.close()


def _of_the_run(client: redis.Redis, prefix: str) -> tuple[list[str], list[str]]:
    """Every key that holds ``prefix`` anywhere in its name, and every ACL user that does."""
    keys = sorted(k.decode() for k in client.scan_iter(match=f"*{prefix}*", count=1000))
    users = sorted(
        u.decode() for u in client.execute_command("ACL", "USERS") if prefix in u.decode()
    )
    return keys, users


def _up_on(client: redis.Redis, prefix: str, timeout: float) -> tuple[list[str], list[str]]:
    """What :func:`_of_the_run` finds once the run has relay streams and Celery's keys
    there (a turn under way), waiting up to ``timeout`` seconds for them."""
    deadline = time.monotonic() + timeout
    while True:
        keys, users = _of_the_run(client, prefix)
        kinds = {kind for kind in ("hospital", "celery") for k in keys if f":{kind}:" in k}
        if kinds == {"hospital", "celery"} or time.monotonic() > deadline:
            return keys, users
        time.sleep(0.2)


@pytest.fixture(scope="module")
def on_shared_redis(
    shared_redis: redis.Redis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, object]]:
    """A demo on the shared Redis stopped by Ctrl-C in its job's first turn: what it made
    there while up, then its exit code and what it left. One run for both points (the
    keys it makes, Ctrl-C during a job): a demo costs a minute of CPU. Ctrl-C after the
    job, and the results it prints, are tests/frontend/test_demo_run.py's run's."""
    work = tmp_path_factory.mktemp("demo-shared") / "work"
    run = DemoRun(work, "--rounds", "20", "--local-epochs", "1", redis_url=DEFAULT_URL)
    try:
        run.wait_for(", round 1, ", timeout=600)  # every part is up and a turn is running
        prefix = run.prefix
        keys_up, users_up = _up_on(shared_redis, prefix, timeout=60)
        code = run.interrupt()
        time.sleep(1)
        keys_after, users_after = _of_the_run(shared_redis, prefix)
        yield {
            "run": run,
            "prefix": prefix,
            "keys_up": keys_up,
            "users_up": users_up,
            "code": code,
            "keys_after": keys_after,
            "users_after": users_after,
            "left_running": still_running(work),
        }
    finally:
        run.kill()


@pytest.mark.slow
def test_it_says_which_redis_and_prefix_it_uses(on_shared_redis) -> None:
    run = on_shared_redis["run"]
    assert f"Redis: the one at {DEFAULT_URL} (REDIS_URL)" in run.output
    assert on_shared_redis["prefix"].startswith("demo-")


@pytest.mark.slow
def test_every_key_it_makes_on_a_shared_redis_is_under_its_prefix(on_shared_redis) -> None:
    prefix, keys = on_shared_redis["prefix"], on_shared_redis["keys_up"]
    assert any(k.startswith(f"{prefix}:hospital:") for k in keys), keys  # relay streams
    assert any(k.startswith(f"{prefix}:celery:") for k in keys), keys  # kombu's bindings
    # The coordinator's and the workers' one cache (MEDSPLIT_CACHE_URL, as deployed), under
    # the prefix too.
    assert any(k.startswith(f"{prefix}-cache:") for k in keys), keys
    # Celery's queue is named after the prefix too, so a key kombu made without the
    # global_keyprefix (``_kombu.binding.<queue>``) would show up here.
    assert [k for k in keys if not k.startswith((f"{prefix}:", f"{prefix}-cache:"))] == []


@pytest.mark.slow
def test_every_acl_user_it_makes_is_under_its_prefix(on_shared_redis) -> None:
    prefix, users = on_shared_redis["prefix"], on_shared_redis["users_up"]
    assert len(users) == 3, users
    assert all(u.startswith(f"{prefix}-hospital-") for u in users), users


@pytest.mark.slow
def test_ctrl_c_during_the_job_stops_every_process_with_130_and_leaves_nothing_behind(
    on_shared_redis,
) -> None:
    run = on_shared_redis["run"]
    assert on_shared_redis["code"] == 130, run.output
    assert "stopping (Ctrl-C)" in run.output and "every process stopped" in run.output
    assert on_shared_redis["left_running"] == []
    # Mid-turn, with the relay's streams and Celery's queue in use: none of them stays.
    assert on_shared_redis["keys_after"] == []
    assert on_shared_redis["users_after"] == []


# -- --task segmentation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("--mode", "vertical"),
            "--task segmentation --mode vertical: a vertical job classifies (its parties hold "
            "parts of each record, no masks); leave --mode out (ushaped) or give vanilla or "
            "splitfed",
        ),
        (
            ("--data", "{npz}"),
            "--task segmentation --data {npz}: a MedMNIST set holds a label per image, no "
            "masks; leave --data out for synthetic images with masks",
        ),
    ],
    ids=["vertical", "medmnist"],
)
def test_segmentation_with_a_vertical_mode_or_a_medmnist_set_is_refused(
    args: tuple[str, ...], line: str, tmp_path: Path
) -> None:
    npz = tmp_path / "labels.npz"
    np.savez(
        npz,
        **{f"{s}_images": np.zeros((4, 28, 28), np.uint8) for s in ("train", "val", "test")},
        **{f"{s}_labels": np.zeros((4, 1), np.int64) for s in ("train", "val", "test")},
    )
    work = tmp_path / "work"
    given = [a.format(npz=npz) for a in args]
    done = _demo_exits("--task", "segmentation", *given, "--work-dir", str(work))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == f"medsplit demo: error: {line.format(npz=npz)}"
    assert done.stdout == ""
    assert not work.exists(), "nothing is made before the arguments are known to be good"


def test_segmentation_defaults_to_a_short_ushaped_job_and_classification_keeps_its_own() -> None:
    demo = _demo_module()
    classify = demo.parse_args([])
    assert (classify.task, classify.mode, classify.rounds, classify.local_epochs) == (
        "classification", "vanilla", demo.DEFAULT_ROUNDS, demo.DEFAULT_LOCAL_EPOCHS,
    )  # fmt: skip
    assert classify.batch_size == demo.DEFAULT_BATCH_SIZE
    segment = demo.parse_args(["--task", "segmentation"])
    assert (segment.mode, segment.rounds, segment.local_epochs, segment.batch_size) == (
        "ushaped", 2, 3, 16,
    )  # fmt: skip
    given = demo.parse_args(["--task", "segmentation", "--mode", "vanilla", "--rounds", "5"])
    assert (given.mode, given.rounds) == ("vanilla", 5)


@pytest.mark.slow
def test_a_segmentation_demo_trains_a_unet_and_prints_the_test_dice(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    run = DemoRun(work, "--task", "segmentation", "--exit-when-done", *QUICK, redis_url=None)
    try:
        code = run.wait(timeout=300)
    finally:
        run.kill()
    assert code == 0, run.output
    assert "data: 400 synthetic 32x32 images with masks" in run.output
    # Each agent read a folder of PNG images and masks, as a hospital would lay one out.
    for i in range(3):
        assert len(list((work / f"hospital-{i}" / "masks").glob("*.png"))) == 100
    done = run.found(
        r"done in \d+ s: test mean Dice ([0-9.]+) \(MONAI's DiceMetric over the foreground\): "
        r"the mean of the hospitals' figures weighted by their test-set sizes \(not pooled\), "
        r"over 3 hospitals, on 100 test images"
    )
    dice = float(done[1])
    assert dice > 0.5, run.output  # one round of a few steps already finds the discs
    assert "every process stopped" in run.output
    assert still_running(work) == []
