"""What a party's process leaves unimported (issue 26, a lighter agent): deterministic
kernels without TorchInductor, a split without ``torch._dynamo``, the agent's start
without scikit-learn's neighbours nor the PSI library (a vertical job's only).

Each case runs in its own interpreter: what is imported is process-wide.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _probe(code: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_set_deterministic_sets_torch_flag_without_importing_inductor() -> None:
    result = _probe(
        """
import json, sys, torch
from medsplit.runtime import set_deterministic
set_deterministic(True)
on = torch.are_deterministic_algorithms_enabled()
warn = torch.is_deterministic_algorithms_warn_only_enabled()
loaded = "torch._inductor.config" in sys.modules
set_deterministic(False)
print(json.dumps({"on": on, "warn": warn, "loaded": loaded,
                  "off": torch.are_deterministic_algorithms_enabled()}))
"""
    )
    assert result == {"on": True, "warn": False, "loaded": False, "off": False}


def test_set_deterministic_keeps_a_loaded_inductor_in_step() -> None:
    result = _probe(
        """
import json, torch
import torch._inductor.config as inductor
from medsplit.runtime import set_deterministic
set_deterministic(True)
on = inductor.deterministic
set_deterministic(False)
print(json.dumps({"on": on, "off": inductor.deterministic}))
"""
    )
    assert result == {"on": True, "off": False}


def test_split_model_does_not_import_dynamo() -> None:
    result = _probe(
        """
import json, sys, torch
from medsplit.cutting.split import split_model
from medsplit.models.registry import build_model
model = build_model("small_cnn", spatial_dims=2, in_channels=1, num_classes=2)
split = split_model(model, torch.zeros(2, 1, 28, 28), "pool1")
print(json.dumps({"segments": len(split.segments), "dynamo": "torch._dynamo" in sys.modules}))
"""
    )
    assert result == {"segments": 2, "dynamo": False}


def test_agent_start_does_not_import_sklearn_neighbours_nor_the_psi_library() -> None:
    result = _probe(
        """
import json, sys
import hospital_agent.cli
print(json.dumps({
    "neighbours": "sklearn.neighbors" in sys.modules,
    "psi": "private_set_intersection" in sys.modules,
}))
"""
    )
    assert result == {"neighbours": False, "psi": False}


def test_release_freed_memory_gives_kept_pages_back() -> None:
    result = _probe(
        """
import json
from medsplit.runtime import keep_freed_memory, release_freed_memory

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) * 1024

applied = keep_freed_memory().applied
blocks = [bytearray(b"x" * (1 << 20)) for _ in range(64)]  # 64 MiB in heap chunks
del blocks
kept = rss()
released = release_freed_memory()
print(json.dumps({"applied": applied, "released": released, "drop": kept - rss()}))
"""
    )
    assert result["applied"] and result["released"]
    assert result["drop"] > 32 << 20  # most of the 64 MiB freed went back


def test_start_up_objects_are_frozen_out_of_the_collector_and_cycles_still_go() -> None:
    code = """
import gc, json, os, weakref
from medsplit.runtime.collector import freeze_start_up
class Node: pass
os.environ["MEDSPLIT_FREEZE_START_UP"] = "0"
off = freeze_start_up()
os.environ["MEDSPLIT_FREEZE_START_UP"] = "1"
garbage = Node(); garbage.me = garbage; before = weakref.ref(garbage); del garbage
frozen = freeze_start_up()
garbage = Node(); garbage.me = garbage; after = weakref.ref(garbage); del garbage
gc.collect()
print(json.dumps({"off": off, "frozen": frozen, "count": gc.get_freeze_count(),
                  "before": before() is None, "after": after() is None}))
"""
    result = _probe(code)
    assert result["off"] == 0 and result["frozen"] == result["count"] > 1000
    # A cycle that is garbage when it freezes is collected first; one made later as ever.
    assert (result["before"], result["after"]) == (True, True)
