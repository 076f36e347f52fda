"""Deterministic kernels without importing TorchInductor.

``torch.use_deterministic_algorithms`` (torch 2.13) first imports
``torch._inductor.config`` to set the compiler's own ``deterministic`` flag, and that
import pulls in about 800 modules (sympy, mpmath, Inductor's configuration): measured on
the project's 2-CPU machine at 70 MiB of resident memory and 3-8 s, more than MONAI's
whole import costs in time. A party that never compiles a graph (the hospital agent runs
eager segments and ``torch.fx`` graphs only) needs just the eager kernels' flag, which is
what :func:`set_deterministic` sets. Inductor's flag is set too where Inductor's
configuration is already loaded, so a process that does compile keeps both in step.

Which kernels run is the same as with ``torch.use_deterministic_algorithms``; no value
computed by eager or ``torch.fx`` code changes.
"""

from __future__ import annotations

import sys

import torch

_INDUCTOR_CONFIG = "torch._inductor.config"


def set_deterministic(on: bool, *, warn_only: bool = False) -> None:
    """Deterministic (``on``) or the default kernels from now on, for eager code; and for
    compiled code where TorchInductor's configuration is already imported."""
    inductor = sys.modules.get(_INDUCTOR_CONFIG)
    if inductor is not None:
        inductor.deterministic = on
    torch._C._set_deterministic_algorithms(on, warn_only=warn_only)
