"""Cross-check: torch.fx and torch.export cut every registry model alike.

Run from the repository root::

    python bench/check_tracers.py            # all five models at their default shapes
    python bench/check_tracers.py --json

For each model: the cut table through each tracer (equal, row for row), the split at
the model's default pair of cuts through each tracer (equal boundaries and segment
state names, and both splits' outputs and gradients equal to the model's with
``torch.equal``, in training mode from one random stream), and how long each took.
The tests run the two smallest models; this runs the matrix. Exit status 1 on any
difference.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time

import torch

from medsplit.cutting import cut_table, split_model
from medsplit.cutting.trace import EXPORT, FX
from medsplit.models import build_model, get_model_spec, model_names


def _exact(model: torch.nn.Module, split: object, x: torch.Tensor) -> bool:
    reference = copy.deepcopy(model).train()
    for segment in split.segments:  # type: ignore[attr-defined]
        segment.train()
    torch.manual_seed(0)
    expected = reference(x)
    torch.manual_seed(0)
    got = split.forward(x)  # type: ignore[attr-defined]
    expected.square().sum().backward()
    got.square().sum().backward()
    theirs = {k: p for s in split.segments for k, p in s.named_parameters()}  # type: ignore[attr-defined]
    return torch.equal(expected, got) and all(
        torch.equal(p.grad, theirs[k].grad) for k, p in reference.named_parameters()
    )


def check(name: str) -> dict[str, object]:
    """The cross-check of one registry model."""
    spec = get_model_spec(name)
    model = build_model(name, seed=0)
    x = torch.randn(2, *spec.default_input_shape)
    seconds: dict[str, float] = {}
    tables, splits = {}, {}
    for tracer in (FX, EXPORT):
        start = time.perf_counter()
        tables[tracer] = cut_table(model, x, tracer=tracer)
        splits[tracer] = split_model(model, x, spec.default_cut_pair, tracer=tracer)
        seconds[tracer] = round(time.perf_counter() - start, 2)
    a, b = splits[FX], splits[EXPORT]
    return {
        "model": name,
        "rows": len(tables[FX]),
        "tables_equal": tables[FX] == tables[EXPORT],
        "boundaries_equal": a.boundaries == b.boundaries,
        "state_names_equal": [set(s.state_dict()) for s in a.segments]
        == [set(s.state_dict()) for s in b.segments],
        "fx_exact": _exact(model, a, x),
        "export_exact": _exact(model, b, x),
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--model", action="append", choices=model_names())
    args = parser.parse_args(argv)
    results = [check(name) for name in args.model or model_names()]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            flags = [k for k, v in r.items() if isinstance(v, bool) and not v]
            verdict = "alike" if not flags else "DIFFER: " + ", ".join(flags)
            print(f"{r['model']}: {r['rows']} cuts, {verdict}, seconds {r['seconds']}")
    ok = all(all(v for v in r.values() if isinstance(v, bool)) for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
