"""A hospital's local data: read it, check it, split it locally, fit it to a job.

Typical use by the agent::

    source = DataSource(kind="folder", path="/data/xrays")
    summary = check_data(source, input_shape=(1, 64, 64), num_classes=2)  # before a turn
    data, summary = load_local(source, input_shape=(1, 64, 64), num_classes=2)
    data = prepare(data, input_shape=(1, 64, 64), num_classes=2)
    # or both at once, the targets checked against the job's task:
    data, summary = load_for_job(source, input_shape=(1, 64, 64), num_classes=2)

The job's augmentation is the core's, per training batch (medsplit.training.augment).

A segmentation set holds a mask per image (``images/`` and ``masks/`` of one file name,
or a CSV ``image,mask``; :mod:`.masks`); a turn reads it for its job, the targets checked
against the job's task::

    source = DataSource(kind="folder", path="/data/ct", task="segmentation")
    data, summary = load_for_job(source, input_shape=(1, 64, 64), num_classes=3,
                                 task="segmentation")  # masks (N, 1, 64, 64)

A vertical party (vertical jobs) reads its records with identifiers instead::

    records = load_vertical(DataSource(kind="table", path="/data/labs.csv", label_column="y"))

Only ``summary.to_json()`` (``records.summary().to_json()``) leaves the hospital (the
heartbeat's ``dataset_summary``).
"""

from hospital_agent.data.local import (
    DEFAULT_VAL_FRACTION,
    DataSummary,
    LocalData,
    check_data,
    load_local,
    split_local,
    summary,
)
from hospital_agent.data.problems import MAX_PROBLEMS, DataProblem, Problem
from hospital_agent.data.sources import DataSource, load_source, read_image
from hospital_agent.data.transforms import load_for_job, prepare
from hospital_agent.data.vertical import VerticalRecords, identifier_of, load_vertical

__all__ = [
    "DEFAULT_VAL_FRACTION",
    "MAX_PROBLEMS",
    "DataProblem",
    "DataSource",
    "DataSummary",
    "LocalData",
    "Problem",
    "VerticalRecords",
    "check_data",
    "identifier_of",
    "load_for_job",
    "load_local",
    "load_source",
    "load_vertical",
    "prepare",
    "read_image",
    "split_local",
    "summary",
]
