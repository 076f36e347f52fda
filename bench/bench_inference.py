"""Benchmark: split inference against unsplit inference of the same model, in one process.

Run from the repository root::

    python bench/bench_inference.py                 # small_cnn and DenseNet121, 1 and 32 images
    python bench/bench_inference.py --repeats 9 --json

A split request is the real path of ``medsplit/turns/inference.py``: the hospital's front
on the images, each serving batch's frame encoded with codec ``none``, sent through an
``InMemoryChannel`` to a server thread that decodes it, checks it (form, batch against
the serving batch, finite values) and runs the server segment, its outputs sent back the
same way and checked by the mode's ``eval_logits``. Unsplit is the same model whole, in
eval mode without gradients, on the same images. The two are timed interleaved, one of
each per repetition, the order alternating. Latency is one request's wall time (p50 and
p95 over the repetitions), throughput the images of a request over its median latency.
The relay (Redis), the coordinator's request and the worker's queue are not in it: they
add a round trip each (see the relay's benchmark). Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import threading
import time

import torch
from report import table, today

from medsplit.channel import InMemoryChannel, RelayKeys
from medsplit.cutting import split_model
from medsplit.defenses.options import PrivacyOptions
from medsplit.models import build_model
from medsplit.modes import get_mode
from medsplit.protocol.optim import OptimizerConfig
from medsplit.protocol.party import Party
from medsplit.turns import TurnIds
from medsplit.turns.inference import (
    inference_limits,
    inference_round,
    predict_through,
    serve_inference,
)

#: (model, cut, input shape): small inputs, as the issue asks.
CASES = {
    "small_cnn": ("pool1", (1, 28, 28)),
    "densenet121": ("features.denseblock1", (1, 64, 64)),
}


def markdown(result: dict[str, object]) -> str:
    """The section's table for ``docs/benchmarks.md`` (see ``bench/run_all.py``)."""
    rows = []
    for r in result["runs"]:  # type: ignore[attr-defined]
        rows.append(
            [
                today(),
                r["model"],
                r["images"],
                f"{r['unsplit_p50_ms']:.2f} / {r['unsplit_p95_ms']:.2f} ms",
                f"{r['split_p50_ms']:.2f} / {r['split_p95_ms']:.2f} ms",
                f"**{r['ratio_p50']:.2f}**",
                f"{r['unsplit_images_per_s']:,.0f} / {r['split_images_per_s']:,.0f}",
                f"{r['bytes_per_request']:,}",
            ]
        )
    return table(
        [
            "date",
            "model",
            "images per request",
            "unsplit p50 / p95",
            "split p50 / p95",
            "split / unsplit (p50)",
            "images/s unsplit / split",
            "bytes on the wire per request",
        ],
        rows,
    ) + (
        f"\n\n{result['repeats']} interleaved repetitions per row, "
        f"{result['torch_threads']} torch thread{'' if result['torch_threads'] == 1 else 's'}, "
        f"serving batch {result['serving_batch']}."
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_case(name: str, images: int, repeats: int, serving_batch: int) -> dict[str, object]:
    cut, shape = CASES[name]
    model = build_model(name, in_channels=shape[0], seed=0).eval()
    x = torch.rand(images, *shape, generator=torch.Generator().manual_seed(0))
    split = split_model(model, x[:2], cut)
    config = OptimizerConfig(name="sgd", lr=0.01)
    front, back = Party.create(split.front, config), Party.create(split.tail, config)
    mode = get_mode("vanilla")
    whole = copy.deepcopy(model).eval()
    limits = inference_limits(serving_batch=serving_batch, samples=images, num_classes=2)
    privacy = PrivacyOptions()
    request = 0

    def split_request() -> tuple[torch.Tensor, int]:
        nonlocal request
        request += 1
        ids = TurnIds("bench", inference_round(request), 0, "vanilla")
        channel, streams = InMemoryChannel(), RelayKeys().streams("bench", "h", "infer")
        server = threading.Thread(
            target=serve_inference,
            kwargs=dict(
                channel=channel,
                streams=streams,
                ids=ids,
                mode=mode,
                split=split,
                party=back,
                limits=limits,
                silence_timeout=60,
                poll=0.01,
            ),
        )
        server.start()
        result = predict_through(
            channel=channel,
            streams=streams,
            ids=ids,
            mode=mode,
            split=split,
            parties={"front": front},
            images=x,
            limits=limits,
            privacy=privacy,
            reply_timeout=60,
        )
        server.join()
        return result.logits, result.counters.bytes_in + result.counters.bytes_out

    def unsplit_request() -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([whole(chunk) for chunk in x.split(serving_batch)])

    def timed(fn: object) -> float:
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        return time.perf_counter() - start

    split_out, wire = split_request()
    assert torch.equal(split_out, unsplit_request()), "split inference must equal unsplit"
    split_s, unsplit_s, ratios = [], [], []
    for repetition in range(repeats):
        if repetition % 2:
            u = timed(unsplit_request)
            s = timed(split_request)
        else:
            s = timed(split_request)
            u = timed(unsplit_request)
        split_s.append(s)
        unsplit_s.append(u)
        ratios.append(s / u)
    return {
        "model": name,
        "cut": cut,
        "input_shape": list(shape),
        "images": images,
        "split_p50_ms": percentile(split_s, 0.5) * 1e3,
        "split_p95_ms": percentile(split_s, 0.95) * 1e3,
        "unsplit_p50_ms": percentile(unsplit_s, 0.5) * 1e3,
        "unsplit_p95_ms": percentile(unsplit_s, 0.95) * 1e3,
        "ratio_p50": statistics.median(ratios),
        "split_images_per_s": images / statistics.median(split_s),
        "unsplit_images_per_s": images / statistics.median(unsplit_s),
        "bytes_per_request": wire,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--images", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--serving-batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a shared machine more threads than free cores "
        "make either side wait on the other's intra-op barriers)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    runs = [
        run_case(name, images, args.repeats, args.serving_batch)
        for name in args.models
        for images in args.images
    ]
    result = {
        "runs": runs,
        "repeats": args.repeats,
        "serving_batch": args.serving_batch,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for r in runs:
            print(
                f"{r['model']:12s} {r['images']:3d} images: unsplit p50 {r['unsplit_p50_ms']:8.2f} "
                f"p95 {r['unsplit_p95_ms']:8.2f} ms; split p50 {r['split_p50_ms']:8.2f} p95 "
                f"{r['split_p95_ms']:8.2f} ms; split/unsplit {r['ratio_p50']:.2f}; "
                f"{r['bytes_per_request']:,} bytes"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
