"""Process-wide settings a party's process applies once at start."""

from medsplit.runtime.allocator import AllocatorTuning, keep_freed_memory, release_freed_memory
from medsplit.runtime.collector import freeze_start_up
from medsplit.runtime.determinism import set_deterministic

__all__ = [
    "AllocatorTuning",
    "freeze_start_up",
    "keep_freed_memory",
    "release_freed_memory",
    "set_deterministic",
]
