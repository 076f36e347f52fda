from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "monitoring"
    verbose_name = "Prometheus metrics"

    def ready(self) -> None:
        from monitoring import checks  # noqa: F401 - registers the deploy check
