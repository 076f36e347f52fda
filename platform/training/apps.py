from django.apps import AppConfig
from django.conf import settings


class TrainingAppConfig(AppConfig):
    name = "training"
    verbose_name = "Jobs and turns"

    def ready(self) -> None:
        """Register the extra modes of ``MEDSPLIT["EXTRA_MODES"]`` (the coordinator's and
        the workers' own configuration: no other mode's code is ever imported)."""
        from medsplit.modes import load_extra_modes

        load_extra_modes(settings.MEDSPLIT.get("EXTRA_MODES", ()))
