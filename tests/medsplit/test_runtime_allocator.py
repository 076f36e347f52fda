"""``medsplit.runtime.keep_freed_memory``: a step-sized buffer comes from the heap, not from
a fresh mapping, once it ran; ``MEDSPLIT_KEEP_FREED_MEMORY=0`` leaves glibc as it was.

Each case runs in its own interpreter: the thresholds are process-wide and set once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import ctypes, json
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
from medsplit.runtime import keep_freed_memory
tuning = keep_freed_memory()
before = libc.mallinfo2().hblkhd
buffer = bytearray(8 << 20)  # an 8 MiB frame's bytes
print(json.dumps({"applied": tuning.applied, "reason": tuning.reason,
                  "mapped": libc.mallinfo2().hblkhd - before}))
"""


def _glibc_with_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "mallinfo2")
    except OSError:
        return False


def probe(setting: str | None) -> dict[str, object]:
    import json

    env = {k: v for k, v in os.environ.items() if k != "MEDSPLIT_KEEP_FREED_MEMORY"}
    if setting is not None:
        env["MEDSPLIT_KEEP_FREED_MEMORY"] = setting
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="needs glibc 2.33+ (mallinfo2)")
def test_a_large_buffer_comes_from_the_heap_once_freed_memory_is_kept() -> None:
    kept = probe(None)
    assert kept == {"applied": True, "reason": "", "mapped": 0}


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="needs glibc 2.33+ (mallinfo2)")
def test_the_setting_off_leaves_the_allocator_mapping_large_buffers() -> None:
    off = probe("0")
    assert off["applied"] is False and "MEDSPLIT_KEEP_FREED_MEMORY" in str(off["reason"])
    assert int(off["mapped"]) >= 8 << 20  # type: ignore[call-overload]
