"""The export tests use the training tests' completed jobs and reporting hospitals."""

from tests.platform_apps.training.conftest import (  # noqa: F401 (fixtures)
    hospital_c,
    job_data,
    make_job,
    three_hospitals,
)
