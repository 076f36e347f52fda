"""The service each hospital runs: enrolment, assignments, local data and its segments."""
