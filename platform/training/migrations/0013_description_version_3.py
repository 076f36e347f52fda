# The job description's version 3 adds fields that every job stored before takes at its
# default: party_models (a vertical party's own model; none: every party ran the job's),
# task (classification), loss (its default) and augmentation (none).
#
# Backwards: version 2 again, those fields gone; a job that uses one of them (not at its
# default) has no version-2 form, so going back refuses while one is stored.

from django.db import migrations

#: The versions before and after, and the new fields' defaults, as written when this
#: migration was made.
BEFORE, AFTER = 2, 3
ADDED = {"party_models": {}, "task": "classification", "loss": "", "augmentation": []}


def to_version_3(apps, schema_editor):
    Job = apps.get_model("training", "Job")
    for job in Job.objects.all().iterator():
        d = job.description
        if d.get("version") == BEFORE:
            job.description = {**d, **ADDED, "version": AFTER}
            job.save(update_fields=["description"])


def to_version_2(apps, schema_editor):
    Job = apps.get_model("training", "Job")
    using = [
        job.pk
        for job in Job.objects.all()
        if any(job.description.get(k, v) != v for k, v in ADDED.items())
    ]
    if using:
        raise RuntimeError(
            f"jobs {using} use fields of version 3 of the job description "
            f"({', '.join(ADDED)}) that version 2 cannot hold: delete them before going "
            "back past 0013_description_version_3"
        )
    for job in Job.objects.all().iterator():
        d = {k: v for k, v in job.description.items() if k not in ADDED}
        job.description = {**d, "version": BEFORE}
        job.save(update_fields=["description"])


class Migration(migrations.Migration):

    dependencies = [
        ("training", "0012_label_leakage"),
    ]

    operations = [migrations.RunPython(to_version_3, to_version_2)]
