# A turn's group in its round's plan (the mode's plan_round): turns of one group run at
# the same time. Every job so far was round-robin, one turn per group in position order,
# so an existing turn's group is its position.

from django.db import migrations, models
from django.db.models import F


def group_is_position(apps, schema_editor):
    apps.get_model("training", "Turn").objects.update(group=F("position"))


class Migration(migrations.Migration):

    dependencies = [
        ("training", "0006_job_mode_from_the_registry"),
    ]

    operations = [
        migrations.AddField(
            model_name="turn",
            name="group",
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.RunPython(group_is_position, migrations.RunPython.noop),
    ]
