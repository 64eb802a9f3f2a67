"""The database the platform benchmarks run against: the PostgreSQL database DATABASE_URL names
(created when missing), migrated, the registry seeded, no runs left from an earlier bench."""

from __future__ import annotations

import os
import sys


def migrated_postgres(need_redis: bool = False) -> None:
    import dj_database_url
    import psycopg

    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres") or (need_redis and not os.environ.get("REDIS_URL")):
        sys.exit("Set DATABASE_URL to a PostgreSQL database (it is created if missing) and REDIS_URL.")
    config = dj_database_url.parse(url)
    with psycopg.connect(host=config["HOST"], port=config["PORT"] or 5432, user=config["USER"], dbname="postgres",
                         autocommit=True) as conn:
        if not conn.execute("select 1 from pg_database where datname=%s", [config["NAME"]]).fetchone():
            conn.execute(f'create database "{config["NAME"]}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from webapp.registry.seed import seed_registry
    from webapp.runs.models import Run

    Run.objects.all().delete()
    seed_registry()
