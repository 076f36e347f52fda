# A job's settings become one versioned description (medsplit.training.description,
# JSON form version 1), filled here for every job from its columns; the columns it
# replaces go. model_name, mode and rounds stay, copied from it, for the queries that
# filter, list and schedule on them.
#
# Backwards: the columns come back filled from the description (the columns without a
# default get one first, so that a table with rows can take them back).

from django.db import migrations, models

#: Version 1 of the description's JSON form, as written when this migration was made.
FORMAT = 1
#: medsplit's OptimizerConfig defaults then: a stored optimizer lacking a key gets it.
OPTIMIZER_DEFAULTS = {
    "name": "sgd",
    "lr": 0.01,
    "momentum": 0.0,
    "weight_decay": 0.0,
    "betas": [0.9, 0.999],
    "schedule": "constant",
    "step_size": 100,
    "gamma": 0.5,
    "total_steps": 1000,
}
#: The columns the description replaces (model_name and mode are copied, not removed).
REPLACED = (
    "spatial_dims",
    "in_channels",
    "num_classes",
    "input_shape",
    "cuts",
    "client_optimizer",
    "server_optimizer",
    "batch_size",
    "local_epochs",
    "max_steps_per_turn",
    "codec",
    "seed",
)


def description_of(job) -> dict:
    """The version-1 description of a job as its columns held it."""
    return {
        "version": FORMAT,
        "model": job.model_name,
        "spatial_dims": job.spatial_dims,
        "in_channels": job.in_channels,
        "num_classes": job.num_classes,
        "input_shape": list(job.input_shape),
        "mode": job.mode,
        "mode_options": {},
        "cuts": list(job.cuts),
        "client_optimizer": {**OPTIMIZER_DEFAULTS, **(job.client_optimizer or {})},
        "server_optimizer": {**OPTIMIZER_DEFAULTS, **(job.server_optimizer or {})},
        "batch_size": job.batch_size,
        "local_epochs": job.local_epochs,
        "max_steps_per_turn": job.max_steps_per_turn,
        "rounds": job.rounds,
        "codec": job.codec,
        "seed": job.seed,
    }


def describe_jobs(apps, schema_editor):
    Job = apps.get_model("training", "Job")
    for job in Job.objects.all().iterator():
        job.description = description_of(job)
        job.save(update_fields=["description"])


def columns_from_descriptions(apps, schema_editor):
    Job = apps.get_model("training", "Job")
    for job in Job.objects.all().iterator():
        d = job.description
        for name in REPLACED:
            setattr(job, name, d[name])
        job.model_name, job.mode, job.rounds = d["model"], d["mode"], d["rounds"]
        job.save(update_fields=[*REPLACED, "model_name", "mode", "rounds"])


class Migration(migrations.Migration):

    dependencies = [
        ("training", "0007_turn_group"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="description",
            field=models.JSONField(default=dict),
        ),
        migrations.RunPython(describe_jobs, columns_from_descriptions),
        migrations.AlterField(
            model_name="job",
            name="description",
            field=models.JSONField(),
        ),
        # Defaults for the columns that had none, only so that going back can re-add
        # them to a table with rows (the backward RunPython fills them right after).
        migrations.AlterField(
            model_name="job",
            name="spatial_dims",
            field=models.PositiveSmallIntegerField(default=2),
        ),
        migrations.AlterField(
            model_name="job",
            name="in_channels",
            field=models.PositiveSmallIntegerField(default=1),
        ),
        migrations.AlterField(
            model_name="job",
            name="num_classes",
            field=models.PositiveIntegerField(default=2),
        ),
        *(migrations.RemoveField(model_name="job", name=name) for name in REPLACED),
    ]
