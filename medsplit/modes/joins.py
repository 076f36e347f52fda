"""How a server joins several parties' embeddings of the same records (vertical).

Each party's front sends one tensor per step; the server sums them, averages them, or
concatenates them along the channels, always in the parties' order, so that the split and
the unsplit model add the same numbers the same way.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

import torch

from medsplit.cutting import BoundaryTensor
from medsplit.errors import ConfigError

SUM, MEAN, CONCAT = "sum", "mean", "concat"
#: Every join, the first the default.
JOINS = (SUM, MEAN, CONCAT)


def join_embeddings(join: str, embeddings: Sequence[torch.Tensor]) -> torch.Tensor:
    """The parties' embeddings joined, in the parties' order (sums in a fixed order, so
    that the split and the unsplit model add the same numbers the same way).

    Raises:
        ConfigError: an unknown join, no embedding, or shapes the join cannot combine.
    """
    if not embeddings:
        raise ConfigError("vertical join of no embeddings: a job needs two or more parties")
    if join in (SUM, MEAN):
        shapes = {tuple(e.shape) for e in embeddings}
        if len(shapes) > 1:
            raise ConfigError(
                f"vertical {join} needs every party's embedding of one shape, got "
                f"{sorted(shapes)}; cut the fronts where they agree, or join by concat"
            )
        total = functools.reduce(operator.add, embeddings)
        return total / len(embeddings) if join == MEAN else total
    if join == CONCAT:
        rest = {tuple(e.shape[:1]) + tuple(e.shape[2:]) for e in embeddings}
        if len(rest) > 1:
            raise ConfigError(
                "vertical concat joins along the channels (dimension 1); the embeddings "
                f"differ elsewhere: {[tuple(e.shape) for e in embeddings]}"
            )
        return torch.cat(list(embeddings), dim=1)
    raise ConfigError(f"vertical join must be one of {list(JOINS)}, got {join!r}")


def single_crossing(boundary: Sequence[BoundaryTensor], *, party: str) -> BoundaryTensor:
    """The one tensor a vertical party's front sends (the join takes one per party).

    Raises:
        ConfigError: its cut lets several tensors (or none) cross.
    """
    if len(boundary) != 1:
        names = [t.name for t in boundary]
        raise ConfigError(
            f"vertical party {party!r}: its cut lets {len(names)} tensors cross ({names}); "
            "the server joins one embedding per party: cut where one tensor crosses "
            "(`medsplit cuts MODEL` lists them)"
        )
    return boundary[0]
