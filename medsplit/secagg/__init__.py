"""Secure aggregation (Bonawitz et al., CCS 2017) of the hospitals' fronts.

The hospitals encode their fronts in the ring Z/2^64 (:mod:`.fixedpoint`), weighted by
their public sample counts, and add pairwise masks that cancel in the sum and a group mask
only they can remove (:mod:`.masks`); the aggregator (:mod:`.aggregator`) sums what it
receives (:mod:`.messages`) and sees uniformly masked vectors only; each hospital unmasks
the sum and divides (:mod:`.hospital`). A round whose hospital drops out is restarted
without it, with fresh seeds (:meth:`.rounds.RoundId.restart_without`). The protocol is in
docs/protocol.md. The core imports no Django nor Celery.
"""

from medsplit.secagg.aggregator import AGGREGATOR, Aggregator
from medsplit.secagg.errors import (
    FixedPointError,
    MessageError,
    RoundFailed,
    RoundIncomplete,
    SecAggError,
    SeedError,
    SubmissionRejected,
)
from medsplit.secagg.fixedpoint import DEFAULT_SCALE_BITS, FixedPoint, clear_weighted_sum
from medsplit.secagg.hospital import HospitalRound, Peer, SealedSecret
from medsplit.secagg.layout import VectorLayout
from medsplit.secagg.masks import GROUP, PAIR, group_mask, keystream_u64, pair_mask
from medsplit.secagg.messages import Aggregate, MaskedSubmission
from medsplit.secagg.rounds import RoundId

__all__ = [
    "AGGREGATOR",
    "DEFAULT_SCALE_BITS",
    "GROUP",
    "PAIR",
    "Aggregate",
    "Aggregator",
    "FixedPoint",
    "FixedPointError",
    "HospitalRound",
    "MaskedSubmission",
    "MessageError",
    "Peer",
    "RoundFailed",
    "RoundId",
    "RoundIncomplete",
    "SealedSecret",
    "SecAggError",
    "SeedError",
    "SubmissionRejected",
    "VectorLayout",
    "clear_weighted_sum",
    "group_mask",
    "keystream_u64",
    "pair_mask",
]
