"""Keep a process's start-up objects out of the cycle collector's walks.

A party's process imports torch, MONAI and its own code first: some 350,000 objects that
live as long as the process. Python's cycle collector walks all of them at every full
collection and once more when the interpreter exits, where it took 1.1 s after a bare
start on a quiet machine and up to 7 s after a turn on a loaded one (an agent told to stop
then took that long to go, after its work was done; ``bench/bench_exit.py``).
:func:`freeze_start_up` moves what exists now into the collector's permanent generation
(``gc.freeze``, as the Python documentation advises for long-lived start-up state): the
collector no longer walks it, reference counting still frees it. The cost: a reference
cycle among those objects that becomes garbage later is never collected.

``MEDSPLIT_FREEZE_START_UP=0`` turns it off.
"""

from __future__ import annotations

import gc
import logging
import os

logger = logging.getLogger(__name__)

ENV = "MEDSPLIT_FREEZE_START_UP"


def freeze_start_up() -> int:
    """Collect once, then freeze every object tracked now; returns how many were frozen
    (0 when turned off)."""
    if os.environ.get(ENV, "1") == "0":
        return 0
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.debug("start-up objects kept out of the collector: %d", frozen)
    return frozen
