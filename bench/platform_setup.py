"""Set-up shared by the benchmarks that run the real platform (``bench_runtime.py``,
``bench_agent.py``, ``bench_overhead.py``, ``bench_scaling.py``): logging, the
environment and database, the Celery worker's command line, starting and stopping child
processes, the whole platform as processes (coordinator, worker, beat, hospital agents),
the per-step stamps of an agent's progress bar, the admin and job that the runs use, and
deleting the Redis keys they made.

Imported by name (``from platform_setup import ...``), not as a package: a script run as
``python bench/<name>.py`` has this folder on ``sys.path``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
_T0 = time.monotonic()


def log(message: str) -> None:
    """Print ``message`` to stderr with the seconds since the benchmark started."""
    print(f"[{time.monotonic() - _T0:7.1f} s] {message}", file=sys.stderr, flush=True)


def shape_of(text: str) -> tuple[int, ...]:
    """``"1,64,64"`` -> ``(1, 64, 64)``."""
    return tuple(int(s) for s in text.split(","))


def new_run(name: str) -> tuple[str, Path]:
    """A unique tag for this run and a new temporary folder named after it and ``name``."""
    tag = uuid.uuid4().hex[:10]
    return tag, Path(tempfile.mkdtemp(prefix=f"medsplit-bench-{name}-{tag}-"))


def print_result(
    result: dict[str, Any], as_json: bool, show: Callable[[dict[str, Any]], None]
) -> None:
    """Print the figures as JSON, or as ``show`` writes them."""
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        show(result)


# -- command line ------------------------------------------------------------------------


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """``--threads``, ``--model``, ``--input-shape``, ``--batch-size``."""
    parser.add_argument("--threads", type=int, default=2, help="torch threads per process")
    parser.add_argument("--model", default="densenet121")
    parser.add_argument("--input-shape", default="1,64,64")
    parser.add_argument("--batch-size", type=int, default=32)


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """``--redis-url``, ``--keep``, ``--json``."""
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


# -- environment and database --------------------------------------------------------------


def configure(
    folder: Path,
    redis_url: str,
    queue: str,
    extra: Mapping[str, str],
    child_extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Set this process's environment (read by the settings) and return the children's.

    ``extra`` is set here and in the children, ``child_extra`` in the children only.
    Scheduling a job sends ``advance_job`` to the worker at once (Celery dispatcher)."""
    database = os.environ.get("DATABASE_URL") or f"sqlite:///{folder / 'bench.sqlite3'}"
    values = {
        "DATABASE_URL": database,
        "REDIS_URL": redis_url,
        "CELERY_BROKER_URL": redis_url,
        "MEDSPLIT_CELERY_QUEUE": queue,
        "MEDSPLIT_DATA_DIR": str(folder / "data"),
        "MEDSPLIT_CHECKPOINT_DIR": str(folder / "checkpoints"),
        "MEDSPLIT_JOB_DISPATCHER": "workers.dispatch.CeleryDispatcher",
        "MEDSPLIT_LOG_LEVEL": "INFO",
        "DJANGO_SETTINGS_MODULE": "coordinator.settings",
        **extra,
    }
    os.environ.update(values)
    os.environ.pop("MEDSPLIT_WORKER_REDIS_URL", None)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "platform")])
    env.update(child_extra or {})
    return env


def setup_django() -> None:
    """Put the platform on ``sys.path``, set Django up and migrate the database."""
    for path in (str(REPO / "platform"), str(REPO)):
        if path not in sys.path:
            sys.path.insert(0, path)
    import django
    from django.core.management import call_command

    django.setup()
    # The worker logs its turns (to its log file); this process only reports progress.
    logging.getLogger("medsplit").setLevel(logging.WARNING)
    call_command("migrate", verbosity=0)


# -- processes -----------------------------------------------------------------------------

# torch.set_num_threads before Celery (and the worker's torch work) starts.
_WORKER_MAIN = (
    "import sys, torch; torch.set_num_threads(int(sys.argv[1])); "
    "from celery.__main__ import main; sys.argv = ['celery', *sys.argv[2:]]; sys.exit(main())"
)
# What a Celery worker logs once it takes tasks.
WORKER_READY = " ready."


def worker_command(threads: int, queue: str, name: str) -> list[str]:
    """A Celery worker (``--pool=solo``, ``threads`` torch threads) on ``queue``, node
    ``<name>@localhost``."""
    return [
        sys.executable,
        "-c",
        _WORKER_MAIN,
        str(threads),
        "-A",
        "workers.celery_app",
        "worker",
        "--pool=solo",
        "-Q",
        queue,
        "-n",
        f"{name}@localhost",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-l",
        "INFO",
    ]


def spawn(
    args: list[str], env: dict[str, str], log_path: Path, *, append: bool = False
) -> subprocess.Popen:
    """Start ``args`` in the repository root, stdout and stderr to ``log_path``
    (truncated, or appended to with ``append``), no stdin."""
    with open(log_path, "ab" if append else "wb") as out:
        return subprocess.Popen(
            args,
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def read_log(path: Path) -> str:
    """The text of a process's log file, ``""`` if it cannot be read."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def stop_processes(
    processes: Mapping[str, subprocess.Popen],
    wait: float = 15.0,
    *,
    on_kill: Callable[[str], None] | None = None,
) -> None:
    """SIGTERM to each of ``processes`` still running, then SIGKILL to whatever still
    runs ``wait`` seconds later (``on_kill`` is told the name of each one killed)."""
    for process in processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + wait
    for name, process in processes.items():
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            if on_kill is not None:
                on_kill(name)
            process.kill()
            process.wait()


def clean_hospitals(redis_url: str, queue: str, slugs: list[str]) -> str:
    """:func:`cleanup_redis` of a run with hospital agents (their streams, hand-offs and
    ACL users), said in words."""
    deleted = cleanup_redis(redis_url, queue, slugs, handoffs=True, acl_users=True)
    return f"deleted {deleted} Redis keys and {len(slugs)} ACL user(s)"


@contextmanager
def platform_run(
    folder: Path,
    *,
    keep: bool,
    tails: Callable[[], str],
    stop: Callable[[], None],
    clean_redis: Callable[[], str],
) -> Iterator[None]:
    """Migrate the database, then run the body; if it fails, log the processes' logs
    (``tails``). Whatever happens: ``stop`` the processes, ``clean_redis`` (it says what it
    deleted) and remove ``folder`` unless ``keep``."""
    try:
        setup_django()
        log("database migrated")
        yield
    except BaseException:
        log(f"failed; process logs:\n{tails()}")
        raise
    finally:
        log("stopping the processes")
        stop()
        log(clean_redis())
        remove_folder(folder, keep)


def remove_folder(folder: Path, keep: bool) -> None:
    """Remove the temporary folder, or log that it is kept."""
    if keep:
        log(f"kept {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)


# -- the coordinator's side ------------------------------------------------------------------


def make_admin(username: str) -> Any:
    """A new consortium admin ``username`` (no password), as the ``Actor`` to act as."""
    from django.contrib.auth import get_user_model

    from accounts.models import Membership
    from kernel.actors import Actor, ActorKind, Role

    user = get_user_model().objects.create_user(username=username, password=None)
    Membership.objects.create(user=user, role=Role.CONSORTIUM_ADMIN.value)
    return Actor(ActorKind.PERSON, user=user, role=Role.CONSORTIUM_ADMIN, source_ip="127.0.0.1")


def default_cut(model: str) -> str:
    """The registry's default cut of ``model``."""
    from medsplit.models.registry import get_model_spec

    return get_model_spec(model).default_cut


def job_data(*, name: str, model: str, batch_size: int, steps: int, slug: str) -> dict[str, Any]:
    """A one-hospital, one-round vanilla job at the model's default cut: codec ``none``,
    SGD with momentum on both sides, ``steps`` steps per turn, a random seed."""
    optimizer = {"name": "sgd", "lr": 0.01, "momentum": 0.9}
    return {
        "name": name,
        "model": model,
        "num_classes": 2,
        "mode": "vanilla",
        "cuts": [default_cut(model)],
        "client_optimizer": optimizer,
        "server_optimizer": optimizer,
        "batch_size": batch_size,
        "local_epochs": 1,
        "max_steps_per_turn": steps,
        "rounds": 1,
        "codec": "none",
        "seed": uuid.uuid4().int % (2**31 - 1),
        "on_failure": "fail",
        "max_retries": 0,
        "participants": [{"hospital": slug}],
    }


# -- Redis ---------------------------------------------------------------------------------


def cleanup_redis(
    url: str,
    queue: str,
    slugs: Iterable[str],
    *,
    handoffs: bool = False,
    acl_users: bool = False,
) -> int:
    """Delete the queue's keys and the hospitals' streams (and, with ``handoffs``, their
    hand-offs; with ``acl_users``, their ACL users); return how many keys went."""
    import redis

    slugs = list(slugs)
    client = redis.Redis.from_url(url)
    deleted = 0
    try:
        from medsplit.channel import RelayKeys

        keys = RelayKeys(os.environ.get("MEDSPLIT_RELAY_PREFIX", "medsplit"))
        celery = keys.celery_prefix()  # kombu's global_keyprefix (coordinator/settings.py)
        patterns = [f"{celery}{queue}*"]
        for slug in slugs:
            mine = keys.patterns_of(slug)
            patterns += mine if handoffs else mine[:1]
        for pattern in patterns:
            for key in client.scan_iter(match=pattern, count=1000):
                deleted += client.delete(key)
        # Kombu's bindings of the queue (the second name in recent kombu versions).
        deleted += client.delete(
            f"{celery}_kombu.binding.{queue}", f"{celery}_kombu.binding_permanent.{queue}"
        )
        if acl_users:
            for slug in slugs:
                client.execute_command("ACL", "DELUSER", f"{keys.prefix}-hospital-{slug}")
    finally:
        client.close()
    return deleted


# -- the whole platform as processes (bench_overhead.py, bench_scaling.py) -------------------
#
# As ``bench_agent.py`` runs it, with its process helpers (``Processes``, ``wait_until``,
# ``answers``, ``free_port``), imported inside the functions because ``bench_agent``
# imports this module.


def configure_platform(
    folder: Path, redis_url: str, queue: str, threads: int, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``configure`` for a coordinator, worker, beat and agents: hospitals get their own
    Redis ACL users at enrolment (``RedisAclUsers``), ``threads`` OpenMP/MKL threads in
    every child; returns the children's environment."""
    return configure(
        folder,
        redis_url,
        queue,
        {
            "MEDSPLIT_REDIS_ACL_PROVISIONER": "hospitals.relay_acl.RedisAclUsers",
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            **(extra or {}),
        },
        {"PYTHONUNBUFFERED": "1"},
    )


def start_platform(procs: Any, *, threads: int, name: str) -> str:
    """Start the coordinator (``manage.py runserver`` on a free port), a Celery worker
    (``--pool=solo``, node ``<name>@localhost``) and Celery beat, as ``bench_agent.py``
    does; return the coordinator's URL once it answers (the worker may still be starting:
    wait for ``WORKER_READY`` in its log)."""
    from bench_agent import answers, free_port, wait_until

    url = f"http://127.0.0.1:{free_port()}"
    manage = str(REPO / "manage.py")
    procs.start("coordinator", [sys.executable, manage, "runserver", url[7:], "--noreload"])
    procs.start("worker", worker_command(threads, procs.env["MEDSPLIT_CELERY_QUEUE"], name))
    beat = ["-A", "workers.celery_app", "beat", "-s", str(procs.folder / "beat-schedule")]
    beat += ["--pidfile", str(procs.folder / "beat.pid"), "-l", "INFO"]
    procs.start("beat", [sys.executable, "-m", "celery", *beat])
    wait_until("the coordinator to answer", lambda: answers(url + "/"), 120, procs)
    return url


# The agent's progress bar (tqdm, updated from ``TurnClient``'s ``on_step``) configured by
# tqdm's own ``TQDM_*`` environment defaults to print at every training step its count
# and the seconds since the bar was made (the turn's start): no change to the agent.
AGENT_PROGRESS_ENV = {
    "TQDM_MININTERVAL": "0",
    "TQDM_MINITERS": "1",
    "TQDM_BAR_FORMAT": "@@step {n} {elapsed_s:.6f}@@",
}
_STEP_STAMP = re.compile(r"@@step (\d+) ([\d.]+)@@")


def step_stamps(text: str) -> list[list[float]]:
    """Per turn in an agent's log text (one progress bar each), the bar's elapsed seconds
    at the end of training steps 1, 2, ... (the first print of each count)."""
    bars: list[list[float]] = []
    for match in _STEP_STAMP.finditer(text):
        n, seconds = int(match.group(1)), float(match.group(2))
        if n == 0:
            bars.append([])
        elif bars and n == len(bars[-1]) + 1:
            bars[-1].append(seconds)
    return [bar for bar in bars if bar]


def register_hospital(admin: Any, slug: str) -> str:
    """Register hospital ``slug``; its one-time enrolment code."""
    from hospitals import services

    registration = services.hospital_register(actor=admin, name=f"Bench {slug}", slug=slug)
    return registration.enrolment_code.plaintext


def start_agent(
    procs: Any, name: str, *, url: str, code: str, data: Mapping[str, str], log_level: str = "INFO"
) -> int:
    """Start ``python -m hospital_agent run`` as process ``name`` (work directory
    ``<folder>/<name>``), enrolling with ``code``; ``data`` are its ``MEDSPLIT_AGENT_DATA_*``
    values without the prefix. It long-polls for assignments (5 s; the coordinator looks
    every 0.5 s) and heartbeats every 5 s; its progress bar prints step stamps
    (``step_stamps``). Returns its pid."""
    env = {
        **procs.env,
        **AGENT_PROGRESS_ENV,
        "MEDSPLIT_AGENT_COORDINATOR_URL": url,
        "MEDSPLIT_AGENT_WORK_DIR": str(procs.folder / name),
        "MEDSPLIT_AGENT_ENROLMENT_CODE": code,
        "MEDSPLIT_AGENT_POLL_SECONDS": "5",
        "MEDSPLIT_AGENT_HEARTBEAT_SECONDS": "5",
        "MEDSPLIT_AGENT_REPLY_TIMEOUT": "300",
        "MEDSPLIT_AGENT_LOG_LEVEL": log_level,
        **{f"MEDSPLIT_AGENT_DATA_{key.upper()}": value for key, value in data.items()},
    }
    return procs.start(name, [sys.executable, "-m", "hospital_agent", "run"], env)


def wait_enrolled(procs: Any, slugs: list[str], timeout: float = 300.0) -> None:
    """Until every hospital of ``slugs`` has enrolled and reported its data summary."""
    from bench_agent import wait_until

    from hospitals.models import Hospital

    def enrolled() -> bool:
        ready = Hospital.objects.filter(slug__in=slugs, status=Hospital.Status.ENROLLED)
        return ready.exclude(dataset_summary={}).count() == len(slugs)

    wait_until(f"{len(slugs)} agent(s) to enrol and report their data", enrolled, timeout, procs)


def wait_job(procs: Any, job_id: int, timeout: float) -> None:
    """Until job ``job_id`` has completed (``RuntimeError`` if it failed or stopped)."""
    from bench_agent import job_state, wait_until

    from training.states import JobState

    wait_until(
        f"job {job_id} to complete",
        lambda: job_state(job_id) == JobState.COMPLETED,
        timeout,
        procs,
    )


def stop_platform(procs: Any, wait: float = 15.0) -> None:
    """Stop the agents first (they talk to the others), then the rest: SIGTERM, then
    SIGKILL for whatever still runs after ``wait`` seconds."""
    agents = {n: p for n, p in procs.started.items() if n.startswith("agent")}
    rest = {n: p for n, p in procs.started.items() if n not in agents}
    for group in (agents, rest):
        stop_processes(group, wait, on_kill=lambda n: log(f"{n} ignored SIGTERM; killing it"))


def unique_job_ids(tag: str) -> int:
    """Number this database's next job from a large number drawn from ``tag``; return it.

    The relay's stream and hand-off keys carry the job id, and on a shared Redis the test
    suite deletes every key of the job ids its own databases used, which restart at 1:
    a bench job numbered 1 would have its streams deleted under it."""
    from django.db import connection

    from training.models import Job

    start = 1_000_000 + int(tag, 16) % 1_000_000_000
    table = Job._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("DELETE FROM sqlite_sequence WHERE name = %s", [table])
            cursor.execute(
                "INSERT INTO sqlite_sequence (name, seq) VALUES (%s, %s)", [table, start - 1]
            )
        elif connection.vendor == "postgresql":
            cursor.execute(
                "SELECT setval(pg_get_serial_sequence(%s, 'id'), %s)", [table, start - 1]
            )
    return start
