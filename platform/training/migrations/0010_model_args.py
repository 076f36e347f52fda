# The job description's version 2 adds model_args, the keyword arguments of a
# "MODULE:FACTORY" model (medsplit.models.factory); every stored description is
# carried over (a registry model's are none), and model_name takes such names.
#
# Backwards: version 1 again, model_args gone; a job that names a factory model has no
# version-1 form, so going back refuses while one is stored (delete it first).

from django.db import migrations, models

#: The versions before and after, as written when this migration was made.
BEFORE, AFTER = 1, 2


def to_version_2(apps, schema_editor):
    Job = apps.get_model("training", "Job")
    for job in Job.objects.all().iterator():
        d = job.description
        if d.get("version") == BEFORE:
            job.description = {**d, "version": AFTER, "model_args": {}}
            job.save(update_fields=["description"])


def to_version_1(apps, schema_editor):
    Job = apps.get_model("training", "Job")
    factories = [job.pk for job in Job.objects.all() if ":" in job.description.get("model", "")]
    if factories:
        raise RuntimeError(
            f"jobs {factories} name MODULE:FACTORY models, which version 1 of the job "
            "description cannot hold: delete them before going back past 0010_model_args"
        )
    for job in Job.objects.all().iterator():
        d = {k: v for k, v in job.description.items() if k != "model_args"}
        job.description = {**d, "version": BEFORE}
        job.save(update_fields=["description"])


class Migration(migrations.Migration):

    dependencies = [
        ("training", "0009_secure_aggregation"),
    ]

    operations = [
        migrations.AlterField(
            model_name="job",
            name="model_name",
            field=models.CharField(db_index=True, max_length=200),
        ),
        # After it, so that going back refuses a factory job before the column shrinks.
        migrations.RunPython(to_version_2, to_version_1),
    ]
