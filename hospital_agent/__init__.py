"""The service each hospital runs: enrolment, assignments, local data and its segments."""

__version__ = "0.1.0"
