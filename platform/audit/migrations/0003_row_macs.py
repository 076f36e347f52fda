"""Every audit row gets a MAC under a key the database never holds (audit/macs.py).

Rows written before this version are signed here, once, with the coordinator's current
key: the upgrade vouches for the chain as it stands (run ``manage.py audit_verify`` before
upgrading). On PostgreSQL the append-only trigger is switched off for that one update and
on again, inside the migration's transaction.
"""

from django.db import migrations, models


def sign_existing_rows(apps, schema_editor):
    from audit.macs import mac_keys

    events = apps.get_model("audit", "AuditEvent")
    table = events._meta.db_table
    keys = mac_keys()
    connection = schema_editor.connection
    postgres = connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, hash FROM {table} WHERE mac = '' ORDER BY id")
        rows = cursor.fetchall()
        if not rows:
            return
        if postgres:
            cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER audit_event_append_only")
        cursor.executemany(
            f"UPDATE {table} SET mac_key_id = %s, mac = %s WHERE id = %s",
            [(keys.current, keys.mac(row_hash), row_id) for row_id, row_hash in rows],
        )
        if postgres:
            cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER audit_event_append_only")


class Migration(migrations.Migration):
    dependencies = [("audit", "0002_append_only_triggers")]

    operations = [
        migrations.AddField(
            model_name="auditevent",
            name="mac",
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name="auditevent",
            name="mac_key_id",
            field=models.CharField(blank=True, max_length=16),
        ),
        migrations.RunPython(sign_existing_rows, migrations.RunPython.noop),
    ]
