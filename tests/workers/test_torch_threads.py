"""The test process trains its references on the thread count of the processes it starts.

The platform's exactness tests compare what agent and worker processes trained (each
starting with torch's default thread count on this machine) with unsplit training in
this process, bit for bit; the order in which a convolution's gradients are summed
follows the thread count (on this machine, one thread against two changes small_cnn's
``conv1.conv.weight`` after one step), so the two must agree. A benchmark's ``main()``, run in this
process by ``tests/repo/test_bench_*.py``, sets it to one thread; the suite's
``_torch_threads_as_found`` fixture gives it back. This file runs after those in one
test process (``tests/repo`` sorts before ``tests/workers``), where a leak shows.
"""

from __future__ import annotations

import subprocess
import sys

import torch


def test_this_process_computes_on_the_thread_count_of_the_processes_it_starts() -> None:
    fresh = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert torch.get_num_threads() == int(fresh.stdout), (
        "a test left this process on another torch thread count than a fresh process's: "
        "references trained here no longer equal the agents' and workers' weights"
    )
