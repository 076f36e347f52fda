# The job description's version 4 adds the privacy options (measurements and defenses,
# all off: every job stored before took none).
#
# Backwards: version 3 again, the field gone; a job with a privacy option on has no
# version-3 form, so going back refuses while one is stored.

from django.db import migrations

#: The versions before and after, and the new field's default, as written when this
#: migration was made.
BEFORE, AFTER = 3, 4
ADDED = {"privacy": {}}


def to_version_4(apps, schema_editor):
    Job = apps.get_model("training", "Job")
    for job in Job.objects.all().iterator():
        d = job.description
        if d.get("version") == BEFORE:
            job.description = {**d, **ADDED, "version": AFTER}
            job.save(update_fields=["description"])


def to_version_3(apps, schema_editor):
    Job = apps.get_model("training", "Job")
    using = [
        job.pk
        for job in Job.objects.all()
        if any(job.description.get(k, v) != v for k, v in ADDED.items())
    ]
    if using:
        raise RuntimeError(
            f"jobs {using} use the privacy options of version 4 of the job description, "
            "which version 3 cannot hold: delete them before going back past "
            "0014_description_version_4"
        )
    for job in Job.objects.all().iterator():
        d = {k: v for k, v in job.description.items() if k not in ADDED}
        job.description = {**d, "version": BEFORE}
        job.save(update_fields=["description"])


class Migration(migrations.Migration):

    dependencies = [
        ("training", "0013_description_version_3"),
    ]

    operations = [migrations.RunPython(to_version_4, to_version_3)]
