# A job state reason that tells one hospital's failure: that hospital, and what the other
# participants see instead (kernel.permissions: least privilege). Written by hand after
# `makemigrations`; depends on 0004 only to keep one leaf.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('hospitals', '0002_relay_suspension'),
        ('training', '0004_participant_recipient_keys'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='state_reason_hospital',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='hospitals.hospital'),
        ),
        migrations.AddField(
            model_name='job',
            name='state_reason_shared',
            field=models.TextField(blank=True),
        ),
    ]
