"""Keep freed memory in the process, so that a step's large buffers are not fresh pages.

Every step allocates and frees buffers of the same sizes: the activations and gradients,
the frame's bytes from ``encode_frame``, the relay's replies. glibc serves an allocation
above its mmap threshold with a fresh ``mmap`` and gives it back on ``free``, and trims the
heap's free top; either way the next step writes to new pages, and the kernel faults each
one in. For a short step that is a large part of the cost (``bench/bench_step_breakdown.py``:
encoding an 800 KB frame took 1.8–2.7 ms that way, 0.14 ms with freed memory kept; see
docs/benchmarks.md). :func:`keep_freed_memory` raises both thresholds with ``mallopt``,
as PyTorch's CPU tuning advice does with another allocator: what a step freed is reused by
the next. Only how memory is obtained changes, never a value (exactness holds). The cost: a
process keeps its peak heap instead of returning freed memory to the system.

``MEDSPLIT_KEEP_FREED_MEMORY=0`` turns it off. On a C library without ``mallopt`` (not
glibc) it does nothing and says so in its result.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from dataclasses import dataclass

logger = logging.getLogger(__name__)

#: ``mallopt`` parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: glibc's largest mmap threshold on 64-bit systems (``DEFAULT_MMAP_THRESHOLD_MAX``):
#: a buffer above it (32 MiB) is mapped and unmapped as before.
MMAP_THRESHOLD = 32 << 20
#: Free memory at the top of the heap kept before glibc trims it.
TRIM_THRESHOLD = 256 << 20
ENV = "MEDSPLIT_KEEP_FREED_MEMORY"


@dataclass(frozen=True)
class AllocatorTuning:
    """What :func:`keep_freed_memory` did: ``applied``, or ``reason`` why not."""

    applied: bool
    reason: str = ""


_done: AllocatorTuning | None = None


@functools.cache
def _libc() -> ctypes.CDLL:
    # Looked up once: find_library runs ldconfig (2-3 ms), and the agent trims after
    # every assignment, on the way from one turn to the next.
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def keep_freed_memory() -> AllocatorTuning:
    """Raise glibc's mmap and trim thresholds for this process (once; later calls return
    the first result)."""
    global _done
    if _done is not None:
        return _done
    if os.environ.get(ENV, "1").strip().lower() in {"0", "false", "no", "off"}:
        _done = AllocatorTuning(False, f"{ENV} is off")
        return _done
    try:
        mallopt = _libc().mallopt
    except (OSError, AttributeError) as e:
        _done = AllocatorTuning(False, f"no mallopt in this C library: {e}")
        return _done
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    ):
        _done = AllocatorTuning(False, "mallopt refused the thresholds")
    else:
        _done = AllocatorTuning(True)
    logger.debug("allocator: %s", _done)
    return _done


def release_freed_memory() -> bool:
    """Give the heap's free pages back to the system (glibc ``malloc_trim(0)``).

    With freed memory kept (:func:`keep_freed_memory`), what a one-off piece of work freed
    stays resident: the agent's data check at start-up (a DenseNet121-sized input's
    temporaries, about 100 MiB measured) or a turn's buffers once it is over. Called after
    such work, not between steps, so the steps still reuse their pages. Only resident
    memory changes, never a value. ``False`` where the C library has no ``malloc_trim``
    or nothing was released.
    """
    try:
        trim = _libc().malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))
