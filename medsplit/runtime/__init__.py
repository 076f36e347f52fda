"""Process-wide settings a party's process applies once at start."""

from medsplit.runtime.allocator import AllocatorTuning, keep_freed_memory, release_freed_memory
from medsplit.runtime.determinism import set_deterministic

__all__ = ["AllocatorTuning", "keep_freed_memory", "release_freed_memory", "set_deterministic"]
