"""Benchmark: MedSplit's split step between two processes against PyTorch's own RPC with
distributed autograd running the same split model between two processes.

Run from the repository root, with Redis running (``REDIS_URL``, default
``redis://127.0.0.1:6379/0``)::

    .venv/bin/python bench/bench_rpc_peer.py          # DenseNet121, 1x64x64, batch 32 (goal >= 1.0)
    .venv/bin/python bench/bench_rpc_peer.py --blocks 3 --steps 10 --warmup 2 --threads 1 --json

Every path trains the same segments: the registry model (``medsplit.models``, seed 0)
cut by ``medsplit.cutting.split_model`` at the registry's default cut; the hospital
process runs the front, the server process runs the back and the cross-entropy loss
(vanilla mode: the labels go to the server with the activations). Both sides use SGD
with momentum (lr 0.01, momentum 0.9) built by ``medsplit.protocol.optim`` (single-tensor
implementation), and every path sees the same batches: a synthetic training set of
``(warmup + steps) x batch`` images, drawn in the job's order by
``medsplit.training.schedule.turn_batches`` for round ``b`` in block ``b``. Every path
starts from the same weights, so their losses must agree (they are compared).

The peer (``rpc-*``): two processes joined by ``torch.distributed.rpc`` with the
TensorPipe backend on 127.0.0.1 (a free port). The hospital process, per step:
``front(x)`` inside a ``torch.distributed.autograd`` context; ``rpc_sync`` of the
activations and labels to the server, which returns the loss of ``back``;
``dist_autograd.backward`` from the loss (the gradient at the cut comes back through
distributed autograd); then each side steps its own optimizer with the gradients of the
context (the server's through ``rpc_async`` while the hospital steps its own). That is
what ``DistributedOptimizer`` does; it is not used itself because with TorchScript enabled
it swaps in the scripted functional SGD (deprecated), which would not be the same
optimizer code as MedSplit's. Two peers run by default (``--rpc-variants``): TensorPipe's
own choice of transports (``shm`` for processes on one machine, which polls while idle
and took about 0.3 of a core per process here even between steps) and ``uv`` only
(TCP on the loopback). The goal is judged against the faster of the two.

MedSplit (``medsplit``): two processes, the hospital's ``medsplit.turns.TurnClient`` and
the server's ``medsplit.turns.TurnServer`` (no-op coordinator hooks, checkpoints in memory
every ``--checkpoint-every`` steps as the coordinator's default), each with its own
``RedisChannel`` to the shared local Redis: frames encoded with codec ``none``, the
handshake, a directive per step, snapshots and checkpoints included. This is the runtime
of ``bench_runtime.py`` without the Celery worker and the database.

All processes are started once (``python bench/bench_rpc_peer.py --role ...``), each with
``--threads`` torch threads (``torch.set_num_threads`` and ``OMP_NUM_THREADS``), 1 by
default. More than one is not the same on both paths: MedSplit computes on each process's
main thread, with its OpenMP team, while RPC computes on its handler and distributed
autograd threads; on this shared 2-core machine (load 7-10) the back of DenseNet121 took
4-7 CPU seconds per step on a main thread with 2 threads against 0.5-0.6 on a second
thread with the same setting, or on either with 1 thread. The bench
process sends "run block b" to one path's hospital process at a time, rotating the order
of the paths from block to block, and keeps every other path's processes stopped
(``SIGSTOP``) meanwhile, so an idle path costs the running one nothing. In each block
the hospital records a time stamp after every step; the first ``warmup`` steps of a
block are excluded (with them the process starts, model builds and the MedSplit
handshake). A step's time is the gap between two consecutive stamps. Reported per path:
steps per second (timed steps over timed seconds, all blocks pooled), the median and
mean step time, and the CPU seconds both processes of the path used per step
(``/proc``). The goal, MedSplit steps/s over the faster peer's >= 1.0, is judged on the
medians (single steps hit by other work on a shared machine dominate a mean). Every child
process is stopped (SIGTERM, then SIGKILL) on the way out, also on error or SIGTERM, and
the Redis keys of the run are deleted. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import json
import os
import platform
import queue
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from report import table, today

GOAL = 1.0
SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parents[1]
LR, MOMENTUM = 0.01, 0.9


def log(message: str) -> None:
    print(f"[bench_rpc_peer] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="densenet121")
    parser.add_argument("--input-shape", default=None, help="C,H,W (registry default)")
    parser.add_argument("--cut", default=None, help="registry default cut")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=3, help="runs of each path, alternating")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per block")
    parser.add_argument("--warmup", type=int, default=2, help="untimed first steps per block")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per block")
    parser.add_argument(
        "--rpc-variants",
        default="default,uv",
        help="RPC peers to run, comma-separated: 'default' (TensorPipe's own choice of "
        "transports: shm and uv) or a '+'-joined list of TensorPipe transports, e.g. 'uv'",
    )
    parser.add_argument("--rpc-transports", default="", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    # Internal: the child processes.
    parser.add_argument("--role", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--job", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from medsplit.models import get_model_spec

    spec = get_model_spec(args.model)
    if args.input_shape is None:
        args.input_shape = ",".join(map(str, spec.default_input_shape))
    args.cut = args.cut or spec.default_cut
    if args.warmup < 1 or args.steps < 2 or args.blocks < 1:
        parser.error("need --warmup >= 1, --steps >= 2 and --blocks >= 1")
    return args


def shape_of(text: str) -> tuple[int, ...]:
    return tuple(int(s) for s in text.split(","))


# -- what every child builds, identically -------------------------------------------------


def job_parts(args: argparse.Namespace):
    """The split model, the training config and the training data of the run."""
    import torch

    from medsplit.data import synthetic_split
    from medsplit.protocol.optim import OptimizerConfig
    from medsplit.training.config import TrainingConfig
    from medsplit.training.setup import JobModel

    torch.set_num_threads(args.threads)
    shape = shape_of(args.input_shape)
    model = JobModel(args.model, len(shape) - 1, shape[0], 2, shape, seed=0)
    split = model.split_at((args.cut,))
    optimizer = OptimizerConfig(name="sgd", lr=LR, momentum=MOMENTUM)
    per_block = args.warmup + args.steps
    config = TrainingConfig(
        cuts=(args.cut,),
        client_optimizer=optimizer,
        server_optimizer=optimizer,
        batch_size=args.batch_size,
        max_steps_per_turn=per_block,
        job=args.job,
    )
    train = synthetic_split(per_block * args.batch_size, shape=shape, num_classes=2, seed=7)
    return split, config, train


def block_batches(config, train, block: int):
    from medsplit.training.schedule import turn_batches

    return list(turn_batches(config, train, round_=block, hospital=0))


def watch_parent() -> None:
    """End this child if the bench process goes away (no orphans, even after SIGKILL)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def protocol_out():
    """The pipe to the bench process; anything else written to stdout goes to stderr."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def commands(out) -> Any:
    """Yield the block numbers the bench process asks for; ends on ``quit``."""
    for line in sys.stdin:
        word = line.strip()
        if word == "quit":
            return
        if word.startswith("run "):
            yield int(word.split()[1])
        else:
            raise RuntimeError(f"unknown command {word!r}")


# -- the RPC peer ---------------------------------------------------------------------------

_SERVER: dict[str, Any] = {}


def _server_forward(activations: dict, labels):
    """On the server: the back segment and the loss (recorded by distributed autograd)."""
    back = _SERVER["back"]
    return _SERVER["loss_fn"](back(**activations), labels)


def _server_step(context_id: int) -> None:
    """On the server: step its optimizer with the gradients of this autograd context."""
    import torch.distributed.autograd as dist_autograd

    grads = dist_autograd.get_gradients(context_id)
    for p in _SERVER["params"]:
        p.grad = grads.get(p)
    _SERVER["optimizer"].step()


def _server_threads() -> int:
    """torch threads as an RPC handler thread of the server sees them."""
    import torch

    return torch.get_num_threads()


def rpc_options(args: argparse.Namespace):
    from torch.distributed.rpc import TensorPipeRpcBackendOptions

    options: dict[str, Any] = {}
    if args.rpc_transports:
        options["_transports"] = args.rpc_transports.split(",")
    return TensorPipeRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{args.port}", rpc_timeout=args.timeout, **options
    )


def role_rpc_server(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed.rpc as rpc

    from medsplit.protocol.optim import build_optimizer

    split, _, _ = job_parts(args)
    back = copy.deepcopy(split.tail)
    params = list(back.parameters())
    _SERVER.update(
        back=back,
        params=params,
        optimizer=build_optimizer(params, _optimizer_config()),
        loss_fn=torch.nn.CrossEntropyLoss(),
    )
    rpc.init_rpc("server", rank=1, world_size=2, rpc_backend_options=rpc_options(args))
    rpc.shutdown()  # serves until the hospital shuts down too
    return 0


def _optimizer_config():
    from medsplit.protocol.optim import OptimizerConfig

    return OptimizerConfig(name="sgd", lr=LR, momentum=MOMENTUM)


def role_rpc_hospital(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc

    from medsplit.protocol.optim import build_optimizer

    out = protocol_out()
    split, config, train = job_parts(args)
    front = copy.deepcopy(split.front)
    params = list(front.parameters())
    optimizer = build_optimizer(params, _optimizer_config())
    rpc.init_rpc("hospital", rank=0, world_size=2, rpc_backend_options=rpc_options(args))
    try:
        server_threads = rpc.rpc_sync("server", _server_threads)
        out.write(json.dumps({"ready": True, "server_threads": server_threads}) + "\n")

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            with dist_autograd.context() as context_id:
                activations = front(x)
                loss = rpc.rpc_sync("server", _server_forward, args=(activations, y))
                dist_autograd.backward(context_id, [loss])
                server_step = rpc.rpc_async("server", _server_step, args=(context_id,))
                grads = dist_autograd.get_gradients(context_id)
                for p in params:
                    p.grad = grads.get(p)
                optimizer.step()
                server_step.wait()
            return float(loss)

        for block in commands(out):
            stamps, losses = [], []
            for batch in block_batches(config, train, block):
                losses.append(step(batch.x, batch.y))
                stamps.append(time.perf_counter())
            out.write(json.dumps({"stamps": stamps, "losses": losses}) + "\n")
    finally:
        rpc.shutdown()
    return 0


# -- MedSplit -------------------------------------------------------------------------------


class NoHooks:
    """The coordinator's side of a turn, doing nothing: always run, record nothing."""

    def directive(self):
        from medsplit.turns import Directive

        return Directive.RUN

    def progress(self, progress: object) -> None:
        pass

    def finish(self, metrics: object, progress: object) -> None:
        pass

    def resumed(self, step: int, reason: str) -> None:
        pass


def turn_ids(args: argparse.Namespace, block: int):
    from medsplit.turns import TurnIds

    return TurnIds(args.job, block, 0, "vanilla", "none")


def role_medsplit_server(args: argparse.Namespace) -> int:
    from medsplit.channel import RedisChannel, RelayKeys
    from medsplit.protocol.handoff import export_parties
    from medsplit.training.setup import server_party
    from medsplit.turns import MemoryCheckpointStore, ServerOutcome, TurnServer
    from medsplit.turns.server import SERVER_PARTY

    out = protocol_out()
    split, config, _ = job_parts(args)
    party = server_party(split, config)  # kept across blocks, as the RPC server's is
    channel = RedisChannel(args.redis_url)
    try:
        out.write(json.dumps({"ready": True}) + "\n")
        for block in range(args.blocks):
            server = TurnServer(
                ids=turn_ids(args, block),
                channel=channel,
                streams=RelayKeys().streams(args.job, "hospital"),
                split=split,
                party=party,
                store=MemoryCheckpointStore(export_parties({SERVER_PARTY: party})),
                hooks=NoHooks(),
                batch_size=config.batch_size,
                checkpoint_every=args.checkpoint_every,
                silence_timeout=args.timeout,
            )
            outcome = server.run()
            if outcome != ServerOutcome.COMPLETED:
                raise RuntimeError(f"block {block}: the server's turn ended {outcome}")
    finally:
        channel.close()
    return 0


def role_medsplit_hospital(args: argparse.Namespace) -> int:
    from medsplit.channel import RedisChannel, RelayKeys
    from medsplit.protocol.handoff import export_parties
    from medsplit.training.setup import client_parties
    from medsplit.turns import ClientOutcome, MemorySnapshots, TurnClient

    out = protocol_out()
    split, config, train = job_parts(args)
    state = export_parties(client_parties(split, config))
    channel = RedisChannel(args.redis_url)
    try:
        out.write(json.dumps({"ready": True}) + "\n")
        for block in commands(out):
            stamps: list[float] = []
            losses: list[float] = []

            def on_step(result, stamps=stamps, losses=losses) -> None:
                stamps.append(time.perf_counter())
                losses.append(result.loss)

            client = TurnClient(
                ids=turn_ids(args, block),
                channel=channel,
                streams=RelayKeys().streams(args.job, "hospital"),
                split=split,
                parties=lambda: client_parties(split, config),
                start=state,
                config=config,
                train=train,
                val=None,
                snapshots=MemorySnapshots(),
                reply_timeout=args.timeout,
                on_step=on_step,
            )
            report = client.run()
            if report.outcome != ClientOutcome.COMPLETED:
                raise RuntimeError(f"block {block}: the hospital's turn ended {report.outcome}")
            state = client.state()  # the next block continues from here, as RPC's does
            out.write(
                json.dumps(
                    {
                        "stamps": stamps,
                        "losses": losses,
                        "bytes_per_step": (report.bytes_up + report.bytes_down) / len(stamps),
                    }
                )
                + "\n"
            )
    finally:
        channel.close()
    return 0


ROLES = {
    "rpc-server": role_rpc_server,
    "rpc-hospital": role_rpc_hospital,
    "medsplit-server": role_medsplit_server,
    "medsplit-hospital": role_medsplit_hospital,
}


# -- the bench process ----------------------------------------------------------------------


class Child:
    """One child process: its command pipe, its answers (a reader thread), its log file."""

    def __init__(
        self, name: str, role: str, args: argparse.Namespace, folder: Path, **overrides: Any
    ) -> None:
        self.role = name
        self.log_path = folder / f"{name}.log"
        command = [
            sys.executable,
            str(SCRIPT),
            "--role",
            role,
            *child_args(argparse.Namespace(**{**vars(args), **overrides})),
        ]
        env = dict(os.environ)
        threads = str(args.threads)
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, TP_SOCKET_IFNAME="lo")
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        self.log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log_file,
            text=True,
            start_new_session=True,
        )
        self.answers: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.answers.put(line)
        self.answers.put(None)

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def answer(self, timeout: float) -> dict[str, Any]:
        try:
            line = self.answers.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(
                f"{self.role}: no answer within {timeout:g} s\n{self.tail()}"
            ) from None
        if line is None:
            self.process.wait(10)
            raise RuntimeError(
                f"{self.role} exited ({self.process.returncode}) without answering\n{self.tail()}"
            )
        return json.loads(line)

    def cpu_seconds(self) -> float:
        """User + system CPU time of the process so far (its threads included)."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def pause(self) -> None:
        """Stop every thread of the process (``SIGSTOP``) while the other path runs."""
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.process.pid, signal.SIGCONT)

    def stop(self, wait: float = 10.0) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.process.pid, signal.SIGTERM)
            self.resume()
            try:
                self.process.wait(wait)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(wait)
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        self.log_file.close()


def child_args(args: argparse.Namespace) -> list[str]:
    return [
        f"--model={args.model}",
        f"--input-shape={args.input_shape}",
        f"--cut={args.cut}",
        f"--batch-size={args.batch_size}",
        f"--blocks={args.blocks}",
        f"--steps={args.steps}",
        f"--warmup={args.warmup}",
        f"--threads={args.threads}",
        f"--checkpoint-every={args.checkpoint_every}",
        f"--redis-url={args.redis_url}",
        f"--timeout={args.timeout}",
        f"--port={args.port}",
        f"--job={args.job}",
        f"--rpc-transports={args.rpc_transports}",
    ]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cleanup_redis(url: str, job: str) -> int:
    import redis

    from medsplit.channel import RelayKeys

    client = redis.Redis.from_url(url)
    try:
        pair = RelayKeys().streams(job, "hospital")
        keys = [k for s in (pair.up, pair.down) for k in (s, s + ":seq")]
        return client.delete(*keys) if keys else 0
    finally:
        client.close()


def summarise(blocks: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    gaps: list[float] = []
    seconds = 0.0
    per_block = []
    for block in blocks:
        timed = block["stamps"][warmup - 1 :]
        block_gaps = [b - a for a, b in itertools.pairwise(timed)]
        gaps += block_gaps
        seconds += timed[-1] - timed[0]
        per_block.append(len(block_gaps) / (timed[-1] - timed[0]))
    cpu = sum(b["cpu_s"] for b in blocks)
    return {
        "timed_steps": len(gaps),
        "timed_seconds": seconds,
        "steps_per_s": len(gaps) / seconds,
        "median_step_s": statistics.median(gaps),
        "mean_step_s": seconds / len(gaps),
        "per_block_steps_per_s": per_block,
        "cpu_s_per_step": cpu / sum(len(b["stamps"]) for b in blocks),
        # CPU the *other* path's processes used, idle, while this path ran its blocks.
        "other_idle_cpu_s_per_step": sum(b["other_cpu_s"] for b in blocks)
        / sum(len(b["stamps"]) for b in blocks),
    }


@dataclass(frozen=True)
class Contender:
    """One path of the comparison: an RPC peer (with its transports) or MedSplit."""

    name: str
    kind: str  # "rpc" or "medsplit"
    transports: str = ""  # TensorPipe transports, comma-separated; "" for its default

    @property
    def title(self) -> str:
        if self.kind == "medsplit":
            return "MedSplit: TurnClient / TurnServer over RedisChannel"
        what = self.transports.replace(",", " + ") if self.transports else "default: shm + uv"
        return f"torch.distributed.rpc, TensorPipe ({what} transports), distributed autograd"


def path_list(args: argparse.Namespace) -> list[Contender]:
    paths = []
    for variant in filter(None, args.rpc_variants.split(",")):
        transports = "" if variant == "default" else variant.replace("+", ",")
        paths.append(Contender(f"rpc-{variant}", "rpc", transports))
    return [*paths, Contender("medsplit", "medsplit")]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    args.job = f"bench-rpcpeer-{uuid.uuid4().hex[:10]}"
    paths = path_list(args)
    folder = Path(tempfile.mkdtemp(prefix="bench-rpc-peer-"))
    children: dict[str, Child] = {}
    ready: dict[str, dict[str, Any]] = {}
    try:
        for path in paths:
            extra: dict[str, Any] = {}
            if path.kind == "rpc":
                extra = {"port": free_port(), "rpc_transports": path.transports}
            for side in ("server", "hospital"):
                name = f"{path.name}-{side}"
                children[name] = Child(name, f"{path.kind}-{side}", args, folder, **extra)
        log(
            f"started {len(children)} processes ({args.threads} torch threads each); "
            "building the models"
        )
        for path in paths:
            ready[path.name] = children[f"{path.name}-hospital"].answer(args.timeout)
            if path.kind == "medsplit":
                children[f"{path.name}-server"].answer(args.timeout)
        log("all paths ready")
        for child in children.values():
            child.pause()
        runs: dict[str, list[dict[str, Any]]] = {path.name: [] for path in paths}
        order = []
        for block in range(args.blocks):
            # Rotate, so that no path always goes first or follows the same one.
            shift = block % len(paths)
            order += [p.name for p in paths[shift:] + paths[:shift]]
        for name in order:
            block = len(runs[name])
            mine = [children[f"{name}-{side}"] for side in ("hospital", "server")]
            idle = [c for c in children.values() if c not in mine]
            for child in mine:
                child.resume()
            before = [c.cpu_seconds() for c in mine], [c.cpu_seconds() for c in idle]
            children[f"{name}-hospital"].send(f"run {block}")
            answer = children[f"{name}-hospital"].answer(args.timeout)
            answer["cpu_s"] = sum(c.cpu_seconds() for c in mine) - sum(before[0])
            answer["other_cpu_s"] = sum(c.cpu_seconds() for c in idle) - sum(before[1])
            for child in mine:
                child.pause()
            runs[name].append(answer)
            log(
                f"{name} block {block}: {_rate(answer, args.warmup):.3f} steps/s, "
                f"loss {answer['losses'][-1]:.4f}"
            )
        for child in children.values():
            child.resume()
        for path in paths:
            children[f"{path.name}-hospital"].send("quit")
        for child in children.values():
            child.process.wait(60)
            if child.process.returncode:
                raise RuntimeError(
                    f"{child.role} exited {child.process.returncode}\n{child.tail()}"
                )
    except BaseException:
        for child in children.values():
            log(f"{child.role} log tail:\n{child.tail()}")
        raise
    finally:
        for child in children.values():
            child.stop()
        deleted = cleanup_redis(args.redis_url, args.job)
        log(f"processes stopped; deleted {deleted} Redis keys")
        shutil.rmtree(folder, ignore_errors=True)

    figures = {path.name: summarise(runs[path.name], args.warmup) for path in paths}
    for path in paths:
        figures[path.name]["title"] = path.title
    ms = figures["medsplit"]
    ms_losses = [x for r in runs["medsplit"] for x in r["losses"]]
    versus: dict[str, dict[str, Any]] = {}
    for path in paths:
        if path.kind != "rpc":
            continue
        rpc = figures[path.name]
        losses = [x for r in runs[path.name] for x in r["losses"]]
        versus[path.name] = {
            "ratio_median": rpc["median_step_s"] / ms["median_step_s"],
            "ratio_steps_per_s": ms["steps_per_s"] / rpc["steps_per_s"],
            "ratio_per_block": [
                _rate(m, args.warmup) / _rate(r, args.warmup)
                for r, m in zip(runs[path.name], runs["medsplit"], strict=True)
            ],
            "loss_max_abs_diff": max(abs(a - b) for a, b in zip(losses, ms_losses, strict=True)),
        }
    best = min(versus, key=lambda name: figures[name]["median_step_s"])
    ratio = versus[best]["ratio_median"]
    return {
        "model": args.model,
        "cut": args.cut,
        "input_shape": list(shape_of(args.input_shape)),
        "batch_size": args.batch_size,
        "optimizer": f"sgd lr {LR} momentum {MOMENTUM} (both sides, every path)",
        "threads": args.threads,
        "blocks": args.blocks,
        "timed_steps_per_block": args.steps,
        "warmup_steps_per_block": args.warmup,
        "checkpoint_every": args.checkpoint_every,
        "order": order,
        "paths": figures,
        "versus": versus,
        "best_rpc": best,
        "ratio_median_vs_best_rpc": ratio,
        "goal": GOAL,
        "goal_met": ratio >= GOAL,
        "medsplit_wire_bytes_per_step": runs["medsplit"][-1]["bytes_per_step"],
        "rpc_server_handler_threads": {
            name: answer["server_threads"] for name, answer in ready.items() if name != "medsplit"
        },
        "date": today(),
        "command": shlex.join(sys.orig_argv),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def _rate(block: dict[str, Any], warmup: int) -> float:
    timed = block["stamps"][warmup - 1 :]
    return (len(timed) - 1) / (timed[-1] - timed[0])


# -- output -------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    """The section's tables for ``docs/benchmarks.md``."""
    shape = "x".join(map(str, result["input_shape"]))
    workload = (
        f"{result['model']} {shape}, batch {result['batch_size']}, cut "
        f"`{result['cut']}`, {result['threads']} torch thread(s) per process"
    )
    ms = result["paths"]["medsplit"]
    rows = []
    for name, versus in result["versus"].items():
        rpc = result["paths"][name]
        per_block = versus["ratio_per_block"]
        judged = name == result["best_rpc"]
        verdict = (
            ("met" if versus["ratio_median"] >= result["goal"] else "**not met**")
            if (judged)
            else "– (not the faster peer)"
        )
        rows.append(
            [
                result["date"],
                workload,
                rpc["title"],
                f"{rpc['steps_per_s']:.3f} ({rpc['median_step_s'] * 1e3:.1f})",
                f"{ms['steps_per_s']:.3f} ({ms['median_step_s'] * 1e3:.1f})",
                f"**{versus['ratio_median']:.3f}** ({versus['ratio_steps_per_s']:.3f}; "
                f"{min(per_block):.2f}–{max(per_block):.2f})",
                verdict,
            ]
        )
    main = table(
        [
            "date",
            "workload",
            "peer",
            "peer steps/s (median ms)",
            "MedSplit steps/s (median ms)",
            "MedSplit / peer, median (pooled steps/s; per block)",
            f"goal (≥ {result['goal']:g}, against the faster peer)",
        ],
        rows,
    )
    detail = table(
        [
            "path",
            "timed steps",
            "steps/s",
            "median ms",
            "mean ms",
            "CPU s per step (both processes)",
        ],
        [
            [
                p["title"],
                p["timed_steps"],
                f"{p['steps_per_s']:.3f}",
                f"{p['median_step_s'] * 1e3:.1f}",
                f"{p['mean_step_s'] * 1e3:.1f}",
                f"{p['cpu_s_per_step']:.3f}",
            ]
            for p in result["paths"].values()
        ],
    )
    diffs = max(v["loss_max_abs_diff"] for v in result["versus"].values())
    return (
        f"{main}\n\n{detail}\n\n"
        f"{result['blocks']} blocks per path of {result['warmup_steps_per_block']} warm-up + "
        f"{result['timed_steps_per_block']} timed steps, rotating; the same weights and batches "
        f"on every path (largest loss difference to MedSplit {diffs:.2e}); MedSplit sends "
        f"{result['medsplit_wire_bytes_per_step']:,.0f} frame bytes per step."
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role is not None:
        watch_parent()
        return ROLES[args.role](args)
    # SIGTERM ends the run like Ctrl-C: the child processes are stopped, the keys deleted.
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        result = measure(args)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
