# A job's mode is a registered mode's name (medsplit.modes), checked by the job's
# validation: the column keeps no list of choices, so a mode added later needs no
# migration. Nothing in the table changes.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('training', '0005_state_reason_of_one_hospital'),
    ]

    operations = [
        migrations.AlterField(
            model_name='job',
            name='mode',
            field=models.CharField(default='vanilla', max_length=16),
        ),
    ]
