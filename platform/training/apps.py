from django.apps import AppConfig
from django.conf import settings

#: Where the coordinator's and the workers' configuration lists model modules.
MODEL_MODULES_SETTING = 'MEDSPLIT["MODEL_MODULES"] (MEDSPLIT_MODEL_MODULES)'


class TrainingAppConfig(AppConfig):
    name = "training"
    verbose_name = "Jobs and turns"

    def ready(self) -> None:
        """Register the extra modes of ``MEDSPLIT["EXTRA_MODES"]`` and list the model
        modules of ``MEDSPLIT["MODEL_MODULES"]`` (the coordinator's and the workers' own
        configuration: no other mode's or model's code is ever imported)."""
        from medsplit.models import set_model_modules
        from medsplit.modes import load_extra_modes

        load_extra_modes(settings.MEDSPLIT.get("EXTRA_MODES", ()))
        set_model_modules(settings.MEDSPLIT.get("MODEL_MODULES", ()), setting=MODEL_MODULES_SETTING)
