"""Benchmark: where the time of a short split step goes, piece by piece, over real Redis.

Run from the repository root, with a Redis server running::

    .venv/bin/python bench/bench_step_breakdown.py                    # small_cnn 1x28x28, batch 64
    .venv/bin/python bench/bench_step_breakdown.py --baseline HEAD~3  # and the code of a revision
    .venv/bin/python bench/bench_step_breakdown.py --json

One vanilla step of ``--model`` (default ``small_cnn``, 1x28x28, batch 64, codec ``none``,
SGD with momentum, its registry default cut) is cut into the pieces the platform's step is
made of, each timed on its own, in one thread, on the same batch, with ``--threads`` torch
threads (default 1):

| piece | what runs |
|---|---|
| ``front`` | the hospital's role: ``start`` (the front's forward pass, the frame) |
| ``encode up`` / ``encode down`` | ``encode_frame`` of the activations / gradients frame |
| ``send up`` / ``send down`` | ``RedisChannel.send`` of those bytes |
| ``receive up`` / ``receive down`` | ``RedisChannel.receive`` of them (the frame is waiting) |
| ``decode up`` / ``decode down`` | ``decode_frame`` against the receiver's ``expect()`` |
| ``server`` | the server's role: ``handle`` (checks, back forward + loss + backward, optimizer) |
| ``client back`` | the hospital's role: ``receive`` (checks, front backward, optimizer) |

The same repetition also times one unsplit step (the whole model, the same per-segment
optimizers) and plain redis-py ``SET`` + ``GET`` of each frame's bytes, the least that
moving them through Redis costs. What a step between processes adds besides (a waiting
process waking up, the worker's per-step directive and progress, the agent's hooks) is
not in these pieces; it is the platform's step (``bench_overhead.py``) less their sum.

With ``--baseline REV`` the channel (``medsplit/channel/redis.py``) and the frame codec
(``medsplit/wire/frame.py``) of git revision ``REV`` are loaded beside the working tree's
and the wire pieces are timed with both, interleaved in the same repetitions: the table
shows each piece before and after, and their ratio. Figures are medians of ``--repeats``
repetitions (pieces in a fixed order, the versions taking turns to go first, the unsplit
step alternating first and last); nothing here asserts on time.

With ``--python-parser`` the working tree's wire is timed a second time, in the same
repetitions, with redis-py's pure-Python reply parser and packer instead of hiredis'
parser (``report.use_resp``); each column's SET + GET speaks RESP as its channel does.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import redis
import torch
from report import command_line, environment, table, today, use_resp

import medsplit.wire.frame as frame_module
from medsplit.channel import RedisChannel
from medsplit.cutting import split_model
from medsplit.models import build_model, get_model_spec
from medsplit.modes import get_mode
from medsplit.protocol.optim import OptimizerConfig
from medsplit.protocol.party import Party
from medsplit.protocol.roles import StepIds
from medsplit.runtime import keep_freed_memory

REPO = Path(__file__).resolve().parents[1]
WIRE = ("encode up", "send up", "receive up", "decode up")
WIRE_DOWN = ("encode down", "send down", "receive down", "decode down")
PIECES = ("front", *WIRE, "server", *WIRE_DOWN, "client back")


def load_revision(rev: str, folder: Path) -> tuple[ModuleType, ModuleType]:
    """``medsplit/channel/redis.py`` and ``medsplit/wire/frame.py`` as they were at ``rev``,
    as separate modules; their frames are the working tree's classes, so both codecs feed
    the same roles."""
    modules = []
    for path, name in (
        ("medsplit/channel/redis.py", "baseline_redis"),
        ("medsplit/wire/frame.py", "baseline_frame"),
    ):
        text = subprocess.run(
            ["git", "show", f"{rev}:{path}"], cwd=REPO, check=True, capture_output=True
        ).stdout
        file = folder / f"{name}.py"
        file.write_bytes(text)
        spec = importlib.util.spec_from_file_location(name, file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while it loads
        spec.loader.exec_module(module)
        modules.append(module)
    old_frame = modules[1]
    old_frame.Frame = frame_module.Frame  # type: ignore[attr-defined]
    old_frame.FrameMeta = frame_module.FrameMeta  # type: ignore[attr-defined]
    return modules[0], old_frame


class Wire:
    """One version of the codec and the channel, with its own streams."""

    def __init__(self, name: str, codec: ModuleType, channel: Any) -> None:
        self.name = name
        self.encode: Callable[..., bytes] = codec.encode_frame
        self.decode: Callable[..., Any] = codec.decode_frame
        self.channel = channel
        self.up = f"medsplit-bench:{uuid.uuid4()}:{name}:up"
        self.down = f"medsplit-bench:{uuid.uuid4()}:{name}:down"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def step(wire: Wire, client: Any, server: Any, ids: StepIds, x: torch.Tensor, y: torch.Tensor):
    """One split step through ``wire``, piece by piece: ``{piece: seconds}``, and its bytes."""
    t: dict[str, float] = {}
    t["front"], up = timed(lambda: client.start(ids, x, y))
    t["encode up"], data = timed(lambda: wire.encode(up))
    t["send up"], _ = timed(lambda: wire.channel.send(wire.up, data))
    t["receive up"], got = timed(lambda: wire.channel.receive(wire.up, timeout=30))
    t["decode up"], frame = timed(lambda: wire.decode(got, expect=server.expect()))
    t["server"], down = timed(lambda: server.handle(frame))
    t["encode down"], back = timed(lambda: wire.encode(down))
    t["send down"], _ = timed(lambda: wire.channel.send(wire.down, back))
    t["receive down"], came = timed(lambda: wire.channel.receive(wire.down, timeout=30))
    t["decode down"], answer = timed(lambda: wire.decode(came, expect=client.expect()))
    t["client back"], _ = timed(lambda: client.receive(answer))
    return t, (len(data), len(back))


def bench(args: argparse.Namespace) -> dict[str, Any]:
    tuning = keep_freed_memory()  # as agents and workers do (MEDSPLIT_KEEP_FREED_MEMORY=0: not)
    torch.set_num_threads(args.threads)
    shape = tuple(int(s) for s in args.input_shape.split(","))
    model = build_model(args.model, in_channels=shape[0], seed=0)
    cut = args.cut or get_model_spec(args.model).default_cut
    config = OptimizerConfig(name="sgd", lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(args.batch_size, *shape, generator=gen)
    y = torch.randint(0, 2, (args.batch_size,), generator=gen)
    split = split_model(model, x[:2], cut)
    vanilla = get_mode("vanilla")

    whole = copy.deepcopy(model)
    params = dict(whole.named_parameters())
    unsplit_parties = [
        Party.create(torch.nn.ParameterList([params[n] for n, _ in s.named_parameters()]), config)
        for s in split.segments
    ]
    loss_fn = torch.nn.CrossEntropyLoss()

    def unsplit_step() -> None:
        loss_fn(whole(x), y).backward()
        for party in unsplit_parties:
            party.step()

    wires = [Wire("now", frame_module, RedisChannel(args.url))]
    if args.python_parser:
        python_channel = RedisChannel(args.url)
        use_resp(python_channel._redis, "pure Python")  # the channel's own client, bench only
        wires.append(Wire("python", frame_module, python_channel))
    folder = tempfile.TemporaryDirectory()
    if args.baseline:
        old_redis, old_frame = load_revision(args.baseline, Path(folder.name))
        wires.append(Wire("baseline", old_frame, old_redis.RedisChannel(args.url)))
    roles = {}
    for wire in wires:  # each version trains its own copy, on the same batch
        front = Party.create(copy.deepcopy(split.front), config)
        back = Party.create(copy.deepcopy(split.tail), config)
        roles[wire.name] = (
            vanilla.client_role({"front": front}, split),
            vanilla.server_role(back, split, job="bench"),
        )
    # SET + GET speaks RESP as each wire's channel does: hiredis' parser with redis-py's
    # packer (now), redis-py's alone (python), redis-py's pick (a baseline's channel).
    resp = {"now": "hiredis", "python": "pure Python", "baseline": "hiredis + its packer"}
    plain_clients = {}
    for wire in wires:
        plain_clients[wire.name] = redis.Redis.from_url(args.url)
        use_resp(plain_clients[wire.name], resp[wire.name])
    client_plain = plain_clients["now"]
    key = f"medsplit-bench:{uuid.uuid4()}:plain"

    def set_get(name: str, payload: bytes) -> float:
        client = plain_clients[name]
        start = time.perf_counter()
        client.set(key, payload)
        if client.get(key) != payload:
            raise AssertionError("SET + GET changed the payload")
        return time.perf_counter() - start

    times: dict[str, dict[str, list[float]]] = {w.name: {p: [] for p in PIECES} for w in wires}
    unsplit: list[float] = []
    plain = {w.name: {"up": [], "down": []} for w in wires}
    sizes = (0, 0)
    try:
        for repetition in range(args.warmup + args.repeats):
            timing = repetition >= args.warmup
            if repetition % 2:
                u, _ = timed(unsplit_step)
            # Each version in turn goes first: what runs first after the unsplit step (or
            # after another version's step) finds the caches and the allocator in another
            # state, which showed up as a steady difference where the code was the same.
            turn = repetition % len(wires)
            in_order = wires[turn:] + wires[:turn]
            for wire in in_order:
                client, server = roles[wire.name]
                ids = StepIds("bench", 0, 0, repetition)
                pieces, sizes = step(wire, client, server, ids, x, y)
                if timing:
                    for piece, seconds in pieces.items():
                        times[wire.name][piece].append(seconds)
            if not repetition % 2:
                u, _ = timed(unsplit_step)
            up, down = os.urandom(sizes[0]), os.urandom(sizes[1])
            for wire in in_order:
                up_s, down_s = set_get(wire.name, up), set_get(wire.name, down)
                if timing:
                    plain[wire.name]["up"].append(up_s)
                    plain[wire.name]["down"].append(down_s)
            if timing:
                unsplit.append(u)
    finally:
        client_plain.delete(key)
        for wire in wires:
            for stream in (wire.up, wire.down):
                client_plain.delete(stream, stream + ":seq")
            wire.channel.close()
        for client in plain_clients.values():
            client.close()
        folder.cleanup()
    # Each version trained its own copy on the same batches as the unsplit model: equal
    # weights show that the pieces timed are the whole step (codec none: torch.equal).
    want = dict(whole.named_parameters())
    same = {
        name: all(
            torch.equal(p, want[n])
            for module in (client.front.module, server.tail.module)
            for n, p in module.named_parameters()  # the segments keep the whole's names
        )
        for name, (client, server) in roles.items()
    }
    med = statistics.median
    pieces_ms = {
        name: {piece: med(values) * 1e3 for piece, values in by_piece.items()}
        for name, by_piece in times.items()
    }
    totals = {
        name: med([sum(vals) for vals in zip(*by_piece.values(), strict=True)]) * 1e3
        for name, by_piece in times.items()
    }
    relay = {
        name: {
            "up": med([sum(v) for v in zip(*(by_piece[p] for p in WIRE[1:3]), strict=True)]) * 1e3,
            "down": med([sum(v) for v in zip(*(by_piece[p] for p in WIRE_DOWN[1:3]), strict=True)])
            * 1e3,
        }
        for name, by_piece in times.items()
    }
    columns = {
        name: {
            "pieces_ms": pieces_ms[name],
            "split_total_ms": totals[name],
            "unsplit_ms": med(unsplit) * 1e3,
            "set_get_ms": {k: med(v) * 1e3 for k, v in plain[name].items()},
            "relay_ms": relay[name],
            "same_weights_as_unsplit": same[name],
        }
        for name in pieces_ms
    }
    return {
        "command": command_line("bench_step_breakdown.py", args.argv),
        "date": today(),
        "environment": environment(),
        "allocator": "freed memory kept" if tuning.applied else f"glibc defaults ({tuning.reason})",
        "model": args.model,
        "cut": cut,
        "input_shape": list(shape),
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "baseline": args.baseline,
        "bytes": {"up": sizes[0], "down": sizes[1]},
        "columns": columns,
    }


def _median_of(values: list[Any]) -> Any:
    """Element-wise median of equally shaped nested dicts of numbers."""
    if isinstance(values[0], dict):
        return {k: _median_of([v[k] for v in values]) for k in values[0]}
    return statistics.median(values)


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Before and after, in one run: ``--compare`` pairs of child runs, alternating which
    goes first. *Before*: the glibc allocator's defaults and the wire of ``--baseline``;
    *after*: freed memory kept (:mod:`medsplit.runtime`) and the working tree's wire. Each
    child times its own unsplit step under its own allocator, so each ratio compares like
    with like. Figures are medians over the runs of each run's medians."""
    child = [sys.executable, str(Path(__file__).resolve()), "--json", "--url", args.url]
    child += ["--model", args.model, "--input-shape", args.input_shape]
    child += ["--batch-size", str(args.batch_size), "--threads", str(args.threads)]
    child += ["--repeats", str(args.repeats), "--warmup", str(args.warmup)]
    child += ["--baseline", args.baseline or "HEAD"] + (["--cut", args.cut] if args.cut else [])
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    last: dict[str, Any] = {}
    for index in range(args.compare):
        for variant in ("before", "after") if index % 2 == 0 else ("after", "before"):
            env = dict(os.environ, MEDSPLIT_KEEP_FREED_MEMORY="0" if variant == "before" else "1")
            # This checkout's medsplit, whatever the interpreter has installed.
            env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
            out = subprocess.run(child, env=env, capture_output=True, text=True)
            if out.returncode:
                raise RuntimeError(f"the {variant} run failed: {out.stderr[-2000:]}")
            last = json.loads(out.stdout)
            runs[variant].append(last["columns"]["baseline" if variant == "before" else "now"])
    return {
        **last,
        "command": command_line("bench_step_breakdown.py", args.argv),
        "repeats": f"{args.compare} x {args.repeats}",
        "allocator": "before: glibc defaults; after: freed memory kept",
        "columns": {variant: _median_of(found) for variant, found in runs.items()},
    }


def markdown(result: dict[str, Any]) -> str:
    """The section's table for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    r = result
    names = list(r["columns"])
    cols = [r["columns"][n] for n in names]
    label = {
        "now": "now" + (", hiredis" if "python" in names else ""),
        "python": "now, pure-Python parser",
        "baseline": f"at {r['baseline']}",
        "before": "before",
        "after": "after",
    }
    head = [f"piece ({r['date']}), ms (median)", *(label[n] for n in names)]
    if len(cols) == 2:
        head.append(f"{label[names[0]]} / {label[names[1]]}")

    def row(name: str, values: list[float]) -> list[str]:
        cells = [name, *(f"{v:.3f}" for v in values)]
        if len(values) == 2:
            cells.append(f"{values[0] / values[1]:.2f}")
        return cells

    rows = [row(piece, [c["pieces_ms"][piece] for c in cols]) for piece in PIECES]
    rows.append(row("**sum: split step in one process**", [c["split_total_ms"] for c in cols]))
    rows.append(row("unsplit step", [c["unsplit_ms"] for c in cols]))
    for d in ("up", "down"):
        rows.append(row(f"redis-py SET + GET of the {d} frame", [c["set_get_ms"][d] for c in cols]))

    def ratios(fn: Any) -> str:
        return ", ".join(f"{label[n]} **{fn(c):.3f}**" for n, c in zip(names, cols, strict=True))

    lines = [
        table(head, rows),
        "",
        f"- `{r['command']}`: {r['model']} {'x'.join(map(str, r['input_shape']))} cut at "
        f"`{r['cut']}`, batch {r['batch_size']}, {r['environment']['threads']} torch thread(s), "
        f"{r['environment']['cpus']} CPUs; medians of {r['repeats']} repetitions; frames of "
        f"{r['bytes']['up']:,} bytes up and {r['bytes']['down']:,} down; allocator: "
        f"{r['allocator']}.",
        "- the weights each version trained equal the unsplit model's (`torch.equal`): "
        + ", ".join(
            f"{label[n]} {'yes' if c['same_weights_as_unsplit'] else '**no**'}"
            for n, c in zip(names, cols, strict=True)
        )
        + ".",
        "- split step in one process / unsplit step: "
        + ratios(lambda c: c["split_total_ms"] / c["unsplit_ms"])
        + ".",
    ]
    for d in ("up", "down"):
        lines.append(
            f"- relay send + receive / SET + GET, {d} frame: "
            + ratios(lambda c, d=d: c["relay_ms"][d] / c["set_get_ms"][d])
            + "."
        )
    lines.append(
        "- floor of a split step through Redis, in one process (the compute pieces, checks "
        "included, plus a plain SET + GET of each frame; no encoding, decoding or relay "
        "bookkeeping, no second process) / unsplit step: "
        + ratios(lambda c: floor_ms(c) / c["unsplit_ms"])
        + "."
    )
    return "\n".join(lines)


def floor_ms(column: dict[str, Any]) -> float:
    """The least a split step through Redis could take, from one column's medians: the
    pieces that compute (front, server, client back, with the checks a frame needs) and
    a bare redis-py SET + GET of each frame in their place on the wire."""
    compute = sum(column["pieces_ms"][p] for p in ("front", "server", "client back"))
    return compute + column["set_get_ms"]["up"] + column["set_get_ms"]["down"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--cut", default="", help="default: the model's registry default cut")
    parser.add_argument("--input-shape", default="1,28,28")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=101)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--baseline", default="", metavar="REV", help="also time revision REV")
    parser.add_argument(
        "--compare",
        type=int,
        default=0,
        metavar="N",
        help="N pairs of child runs, before (allocator defaults, --baseline's wire) and after",
    )
    parser.add_argument(
        "--python-parser",
        action="store_true",
        help="also time the working tree's wire with redis-py's pure-Python parser and packer",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    args.argv = argv
    result = compare(args) if args.compare else bench(args)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
