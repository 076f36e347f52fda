"""Cutting a model into segments, and pricing each possible cut."""

from medsplit.cutting.plan import BoundaryTensor
from medsplit.cutting.split import SplitModel, split_model
from medsplit.cutting.table import CutInfo, candidate_cuts, cut_table

__all__ = ["BoundaryTensor", "CutInfo", "SplitModel", "candidate_cuts", "cut_table", "split_model"]
