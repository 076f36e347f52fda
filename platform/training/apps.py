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
        _wake_long_polls_on_change()


def _wake_long_polls_on_change() -> None:
    """Every save or delete of what an agent's assignments are made of wakes the waiting
    long-polls (training/api/long_poll.py), so that the next hospital hears of its turn
    (or of the hand-off it waits for) within a cache read, not a rebuild interval."""
    from django.db.models.signals import post_delete, post_save

    from hospitals.models import Hospital
    from training import models
    from training.assignment_changes import assignments_changed, hospital_changed

    for model in (
        models.Job,
        models.JobParticipant,
        models.Round,
        models.Turn,
        models.HandOff,
        models.Aggregation,
        models.Evaluation,
        models.HospitalEvaluation,
    ):
        for signal in (post_save, post_delete):
            signal.connect(assignments_changed, sender=model, dispatch_uid=f"wake-{model.__name__}")
    post_save.connect(hospital_changed, sender=Hospital, dispatch_uid="wake-Hospital")
