from django.apps import AppConfig


class CoordinatorConfig(AppConfig):
    name = "coordinator"
    verbose_name = "MedSplit coordinator"

    def ready(self) -> None:
        from coordinator import checks  # noqa: F401 - registers the deploy check
