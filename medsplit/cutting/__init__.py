"""Cutting a model into segments, and pricing each possible cut."""

from medsplit.cutting.plan import BoundaryTensor
from medsplit.cutting.segment import Segment
from medsplit.cutting.split import SplitModel, split_model
from medsplit.cutting.table import CutInfo, CutRows, candidate_cuts, cut_table

__all__ = [
    "BoundaryTensor",
    "CutInfo",
    "CutRows",
    "Segment",
    "SplitModel",
    "candidate_cuts",
    "cut_table",
    "split_model",
]
