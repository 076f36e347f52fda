# Hospitals move from one static X25519 key to an ML-DSA-65 identity key. The X25519 key of
# every hospital enrolled so far is kept as ``legacy_public_key``; those hospitals have no
# identity key (generation 0) until their agents move to one (``POST /api/agent/identity/``,
# which the agents do on their own at their next start).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('hospitals', '0002_relay_suspension'),
    ]

    operations = [
        migrations.RenameField(
            model_name='hospital',
            old_name='public_key',
            new_name='legacy_public_key',
        ),
        migrations.AddField(
            model_name='hospital',
            name='identity_key',
            field=models.TextField(blank=True),
        ),
        migrations.AddField(
            model_name='hospital',
            name='identity_fingerprint',
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name='hospital',
            name='identity_generation',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='hospital',
            name='identity_enrolled_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
