"""A hospital's local data: loading, synthesising, dealing out and batching it."""

from medsplit.data.batches import batch_order, iter_batches
from medsplit.data.medmnist import load_medmnist
from medsplit.data.shards import DataSplit, label_counts, shard
from medsplit.data.synthetic import synthetic_segmentation_split, synthetic_split

__all__ = [
    "DataSplit",
    "batch_order",
    "iter_batches",
    "label_counts",
    "load_medmnist",
    "shard",
    "synthetic_segmentation_split",
    "synthetic_split",
]
