"""On PostgreSQL, triggers refuse to change or remove audit rows, whoever asks.

The model refuses UPDATE and DELETE on every database; these triggers also stop raw SQL,
other programs and a careless ``manage.py dbshell``. The chain head may only advance by
one event at a time and may not be removed. Only the tables' owner (or a superuser) can
get past them (``ALTER TABLE ... DISABLE TRIGGER``), and the hash chain still shows what
they changed. Other databases get nothing here: SQLite relies on the model and the chain.
"""

from django.db import migrations

REFUSE_FUNCTION = """
CREATE OR REPLACE FUNCTION audit_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only: % on % is refused', TG_OP, TG_TABLE_NAME
        USING HINT = 'Audit rows are only ever added, by audit.services.audit_record.';
END;
$$
"""

ADVANCE_FUNCTION = """
CREATE OR REPLACE FUNCTION audit_head_advance_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id = OLD.id AND NEW.last_id = OLD.last_id + 1 THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'the audit chain head only advances by one event: % on % is refused',
        TG_OP, TG_TABLE_NAME
        USING HINT = 'The head is only ever moved by audit.services.audit_record.';
END;
$$
"""


def _tables(apps):
    return (
        apps.get_model("audit", "AuditEvent")._meta.db_table,
        apps.get_model("audit", "AuditChainHead")._meta.db_table,
    )


def install(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    events, head = _tables(apps)
    for sql in (
        REFUSE_FUNCTION,
        ADVANCE_FUNCTION,
        f"CREATE TRIGGER audit_event_append_only BEFORE UPDATE OR DELETE ON {events} "
        "FOR EACH ROW EXECUTE FUNCTION audit_refuse_change()",
        f"CREATE TRIGGER audit_event_no_truncate BEFORE TRUNCATE ON {events} "
        "FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse_change()",
        f"CREATE TRIGGER audit_head_advance_only BEFORE UPDATE ON {head} "
        "FOR EACH ROW EXECUTE FUNCTION audit_head_advance_only()",
        f"CREATE TRIGGER audit_head_kept BEFORE DELETE ON {head} "
        "FOR EACH ROW EXECUTE FUNCTION audit_refuse_change()",
        f"CREATE TRIGGER audit_head_no_truncate BEFORE TRUNCATE ON {head} "
        "FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse_change()",
    ):
        schema_editor.execute(sql, params=None)


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    events, head = _tables(apps)
    for trigger, table in (
        ("audit_event_append_only", events),
        ("audit_event_no_truncate", events),
        ("audit_head_advance_only", head),
        ("audit_head_kept", head),
        ("audit_head_no_truncate", head),
    ):
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {table}")
    schema_editor.execute("DROP FUNCTION IF EXISTS audit_head_advance_only()")
    schema_editor.execute("DROP FUNCTION IF EXISTS audit_refuse_change()")


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]

    operations = [migrations.RunPython(install, uninstall)]
