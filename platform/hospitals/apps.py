from django.apps import AppConfig


class HospitalsConfig(AppConfig):
    name = "hospitals"
    verbose_name = "Hospitals"

    def ready(self) -> None:
        from hospitals import schema  # noqa: F401  (registers the agent token scheme)
