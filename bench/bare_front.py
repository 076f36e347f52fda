"""The baseline of ``bench_agent.py --bare``: a bare script that trains a job's front.

It imports only what the job needs: torch, and MONAI because both networks measured here
are built from MONAI's blocks (``small_cnn`` from ``monai.networks.blocks``, DenseNet121
from ``monai.networks.nets``; ``import monai`` loads the same package either way). It
builds the model, keeps the submodules up to the cut as the front (``small_cnn``: up to
``pool1``; DenseNet121: ``features`` up to ``transition1``), holds the images as one
float32 tensor of ``steps x batch`` synthetic images, and for each step runs the front
forward, a backward with a gradient of the activation's shape (what the server would
send back), and SGD with momentum (lr 0.01, momentum 0.9, as the bench's job). No relay,
no coordinator, no checks.

Printed as one JSON line on stdout: the seconds to import torch and MONAI, ``VmRSS``
after the imports and at the end, ``VmHWM`` at the end, all from ``/proc/self/status``.

    .venv/bin/python bench/bare_front.py --model small_cnn --input-shape 1,28,28 --steps 25
"""

from __future__ import annotations

import argparse
import json
import sys
import time

_START = time.perf_counter()


def status() -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of this process, in bytes."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                name, amount, _ = line.split()
                values[name.rstrip(":")] = int(amount) * 1024
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="densenet121", choices=["densenet121", "small_cnn"])
    parser.add_argument("--input-shape", default="1,64,64")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    shape = tuple(int(x) for x in args.input_shape.split(","))

    import monai  # noqa: F401  (the network's blocks; the whole package loads either way)
    import torch
    from torch import nn

    imported = time.perf_counter() - _START
    after_import = status()["VmRSS"]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model == "small_cnn":
        from medsplit.models.small_cnn import small_cnn  # torch and monai.networks only

        model = small_cnn(spatial_dims=len(shape) - 1, in_channels=shape[0], num_classes=2)
        children, cut = list(model.named_children()), "pool1"
    else:
        from monai.networks.nets import DenseNet121

        model = DenseNet121(spatial_dims=len(shape) - 1, in_channels=shape[0], out_channels=2)
        children, cut = list(model.features.named_children()), "transition1"
    names = [n for n, _ in children]
    front = nn.Sequential(*[m for _, m in children[: names.index(cut) + 1]])
    del model, children  # the rest of the model is the server's
    images = torch.rand((args.steps * args.batch_size, *shape), dtype=torch.float32)
    optimizer = torch.optim.SGD(front.parameters(), lr=0.01, momentum=0.9)
    front.train()
    for step in range(args.steps):
        batch = images[step * args.batch_size : (step + 1) * args.batch_size]
        optimizer.zero_grad(set_to_none=True)
        activation = front(batch)
        activation.backward(torch.randn_like(activation))
        optimizer.step()
    end = status()
    json.dump(
        {
            "import_s": imported,
            "rss_after_import": after_import,
            "vm_rss_end": end["VmRSS"],
            "vm_hwm": end["VmHWM"],
            "wall_s": time.perf_counter() - _START,
        },
        sys.stdout,
    )
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
