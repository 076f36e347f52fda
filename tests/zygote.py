"""The tests' ``python -m MODULE ARGS…`` children, forked from a process that imported
torch and MONAI once.

An agent's or a worker's start is mostly ``import torch, monai`` (4-5 s of CPU each, with
four to six such processes in a real-process test, on two cores). The zygote
(``python -m tests.zygote SOCKET``, one per test session) imports those third-party
libraries and then only forks: each child sets the environment, working directory, log
file and ``sys.argv`` it was asked for and runs the module's ``__main__`` as
``python -m`` would, then exits as an interpreter exits (threads joined, ``atexit``).

A child is a process of its own (its own memory, pid and signals); what it shares with a
fresh interpreter's start is everything but the time. Three things keep it that way:

* Only third-party libraries are imported before the fork, never this project's code, so
  nothing of the project reads the zygote's environment at import.
* No torch operation runs in the zygote, so no OpenMP or MKL thread pool exists when it
  forks; a child whose environment differs from the zygote's in a variable that such
  libraries (or the interpreter, or the C library) read when they load
  (:data:`LOAD_TIME_PREFIXES`) starts as a fresh interpreter instead.
* The zygote is single-threaded: it reaps its children by polling.

``MEDSPLIT_TEST_ZYGOTE=0`` starts every child as a fresh interpreter.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: Imported once in the zygote: the libraries most of a child's start-up is spent in.
PRELOAD = (
    "numpy",
    "torch",
    "monai",
    "monai.data",
    "monai.transforms",
    "monai.networks.nets",
    "safetensors.torch",
    "redis",
    "requests",
    "tqdm",
    "PIL.Image",
    "cryptography.hazmat.primitives.asymmetric.mldsa",
)

#: Environment variables read when a library, the interpreter or the C library loads: a
#: child that needs other values than the zygote's is not forked.
LOAD_TIME_PREFIXES = (
    "PYTHON",
    "OMP_",
    "GOMP_",
    "KMP_",
    "MKL_",
    "OPENBLAS_",
    "NUMEXPR_",
    "TORCH",
    "PYTORCH_",
    "CUDA",
    "MONAI",
    "LD_",
    "MALLOC_",
    "GLIBC_",
)

SWITCH = "MEDSPLIT_TEST_ZYGOTE"


class ZygoteError(RuntimeError):
    """The zygote did not start or did not answer."""


# -- the tests' side ---------------------------------------------------------------------


class ForkedProcess:
    """A child of the zygote, with the part of :class:`subprocess.Popen` the tests use."""

    def __init__(self, zygote: Zygote, pid: int, args: Sequence[str]) -> None:
        self._zygote = zygote
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            # It may have ended between the poll and the signal.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The session's zygote process and how to ask it for a child."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="medsplit-zygote-"))
        self.socket_path = str(self.folder / "zygote.sock")
        # A child's PYTHONPATH is put on its sys.path as the interpreter would; the zygote
        # itself has none, so none of its own entries can leak into a child.
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        log = open(self.folder / "zygote.log", "ab")  # noqa: SIM115 - the process keeps it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.zygote", self.socket_path],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + 120
        while not os.path.exists(self.socket_path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise ZygoteError(f"the zygote did not start:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        return (self.folder / "zygote.log").read_text(errors="replace")[-4000:]

    def can_fork(self, args: Sequence[str], env: Mapping[str, str]) -> bool:
        """Whether ``args`` is ``python -m MODULE…`` of this interpreter, in an
        environment that agrees with the zygote's on every load-time variable."""
        if len(args) < 3 or args[0] != sys.executable or args[1] != "-m":
            return False
        keys = {k for k in (*env, *self.env) if k.startswith(LOAD_TIME_PREFIXES)}
        if any(env.get(k) != self.env.get(k) for k in keys - {"PYTHONPATH"}):
            return False
        # A PYTHONPATH entry holding a library the zygote imported would have shadowed it.
        tops = {name.split(".")[0] for name in PRELOAD}
        for entry in filter(None, env.get("PYTHONPATH", "").split(os.pathsep)):
            folder = Path(entry)
            if any((folder / t).exists() or (folder / f"{t}.py").exists() for t in tops):
                return False
        return True

    def _ask(self, request: dict) -> dict:
        if self.process.poll() is not None:
            raise ZygoteError(f"the zygote has exited:\n{self.log()}")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(30)
            conn.connect(self.socket_path)
            conn.sendall(json.dumps(request).encode() + b"\n")
            answer = _read_line(conn)
        reply = json.loads(answer)
        if "error" in reply:
            raise ZygoteError(reply["error"])
        return reply

    def spawn(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path | str,
        log: Path,
        stderr: Path | None = None,
    ) -> ForkedProcess:
        reply = self._ask(
            {
                "op": "spawn",
                "module": args[2],
                "argv": list(args[3:]),
                "env": dict(env),
                "cwd": str(cwd),
                "log": str(log),
                "stderr": str(stderr) if stderr else "",
            }
        )
        return ForkedProcess(self, int(reply["pid"]), args)

    def status(self, pid: int) -> int | None:
        return self._ask({"op": "status", "pid": pid})["returncode"]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


_zygote: Zygote | None = None


def _session_zygote() -> Zygote:
    global _zygote
    if _zygote is None:
        _zygote = Zygote()
        atexit.register(_zygote.close)
    return _zygote


def start(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path | str,
    log: Path,
    stderr: Path | None = None,
) -> subprocess.Popen | ForkedProcess:
    """Start ``args`` with its output appended to ``log`` (its standard error to
    ``stderr`` if given): forked from the zygote where that is the same as a fresh
    interpreter, else as a fresh interpreter."""
    if os.environ.get(SWITCH, "1") != "0":
        zygote = _session_zygote()
        if zygote.can_fork(args, env):
            return zygote.spawn(args, env=env, cwd=cwd, log=log, stderr=stderr)
    with open(log, "ab") as out, open(stderr or os.devnull, "ab") as err:
        return subprocess.Popen(
            list(args),
            cwd=cwd,
            env=dict(env),
            stdout=out,
            stderr=err if stderr else subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


class Captured:
    """A started command whose standard output and error are kept apart, with
    :meth:`subprocess.Popen.communicate`'s answer (text)."""

    def __init__(self, args: Sequence[str], *, env: Mapping[str, str], cwd: Path | str) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="medsplit-run-"))
        self.args = list(args)
        self.process = start(
            args,
            env=env,
            cwd=cwd,
            log=self.folder / "stdout",
            stderr=self.folder / "stderr",
        )
        self.returncode: int | None = None

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        try:
            self.returncode = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        out = (self.folder / "stdout").read_text(errors="replace")
        err = (self.folder / "stderr").read_text(errors="replace")
        shutil.rmtree(self.folder, ignore_errors=True)
        return out, err


def run(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """:func:`subprocess.run` with ``capture_output=True, text=True``, forked where
    :func:`start` would fork."""
    command = Captured(args, env=os.environ if env is None else env, cwd=cwd or os.getcwd())
    out, err = command.communicate(timeout)
    assert command.returncode is not None
    return subprocess.CompletedProcess(list(args), command.returncode, out, err)


# -- the zygote's side -------------------------------------------------------------------


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    return data


def _die_with_parent() -> None:
    """The zygote ends with the test session that started it (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


def _become(request: dict, listener: socket.socket, conn: socket.socket) -> None:
    """In the forked child: take on the environment, files and argv asked for."""
    listener.close()
    conn.close()
    # The dispositions a fresh interpreter starts with (it ignores SIGPIPE and SIGXFSZ).
    for sig in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # re-read TMPDIR from the child's environment
    out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if request.get("stderr"):
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(err, 2)
        os.close(err)
    sys.argv = [request["module"], *request["argv"]]
    # As the interpreter starts `python -m`: its working directory, then PYTHONPATH.
    extra = [e for e in request["env"].get("PYTHONPATH", "").split(os.pathsep) if e]
    sys.path[:1] = [request["cwd"], *extra]


def serve(socket_path: str) -> None:
    """Answer spawn and status requests until killed; a forked child returns from here
    only to run its module and exit."""
    _die_with_parent()
    for name in PRELOAD:
        importlib.import_module(name)
    # What was imported stays out of the collector's reach: the children neither copy
    # its pages when a collection walks it nor walk it again when they exit (about 1.5 s
    # of an agent's exit, at the tests' load).
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path + ".new")
    listener.listen(64)
    os.rename(socket_path + ".new", socket_path)  # it exists once it answers
    running: set[int] = set()
    ended: dict[int, int] = {}
    while True:
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                running.discard(pid)
                ended[pid] = os.waitstatus_to_exitcode(status)
        ready, _, _ = select.select([listener], [], [], 0.2)
        if not ready:
            continue
        conn, _ = listener.accept()
        request = json.loads(_read_line(conn) or b"{}")
        if request.get("op") == "spawn":
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _become(request, listener, conn)
                return
            running.add(pid)
            reply: dict = {"pid": pid}
        elif request.get("op") == "status":
            pid = int(request["pid"])
            if pid in running:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    running.discard(pid)
                    ended[pid] = os.waitstatus_to_exitcode(status)
            if pid not in running and pid not in ended:
                reply = {"error": f"process {pid} is not a child of the zygote"}
            else:
                reply = {"returncode": ended.get(pid)}
        else:
            reply = {"error": f"unknown request {request.get('op')!r}"}
        conn.sendall(json.dumps(reply).encode() + b"\n")
        conn.close()


def main() -> None:
    serve(sys.argv[1])
    # Only a forked child gets here: run its module as `python -m` does; its exit (or an
    # exception's traceback and status 1) is the interpreter's own.
    import runpy

    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
