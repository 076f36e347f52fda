# Each participant's per-job recipient key (HPKE ML-KEM-768 + X25519), signed by its
# hospital's identity key, as its agent publishes it. Jobs created before have none: their
# participants' agents publish one when they next see the job.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('training', '0003_handoff_per_recipient'),
    ]

    operations = [
        migrations.AddField(
            model_name='jobparticipant',
            name='recipient_key',
            field=models.TextField(blank=True),
        ),
        migrations.AddField(
            model_name='jobparticipant',
            name='recipient_key_signature',
            field=models.TextField(blank=True),
        ),
        migrations.AddField(
            model_name='jobparticipant',
            name='recipient_key_sha256',
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name='jobparticipant',
            name='recipient_key_generation',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='jobparticipant',
            name='recipient_key_published_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
