"""A trigram index on what the episode API's ``q`` searches: ``UPPER(text)``, as Django's
``icontains`` compares on PostgreSQL (``UPPER("text"::text) LIKE UPPER(%q%)``), so a text search
over a whole run reads the index instead of every row of the run.

PostgreSQL only: pg_trgm is a trusted extension (PostgreSQL 13+), so the database's owner may
create it; the index is built concurrently, so writers are not blocked while it builds on a large
table. On SQLite (the default on a laptop) both steps are skipped and ``q`` scans, as before.
"""

from django.db import migrations


class PostgresOnlySQL(migrations.RunSQL):
    """``RunSQL``, doing nothing on a database other than PostgreSQL."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ("dashboard", "0008_episode_drift_and_row"),
    ]

    operations = [
        PostgresOnlySQL("CREATE EXTENSION IF NOT EXISTS pg_trgm", reverse_sql=migrations.RunSQL.noop),
        PostgresOnlySQL(
            'CREATE INDEX CONCURRENTLY IF NOT EXISTS stored_episode_text_trgm ON dashboard_storedepisode '
            'USING gin ((UPPER("text")) gin_trgm_ops)',
            reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS stored_episode_text_trgm",
        ),
    ]
