"""Run.uid: every run gets a folder of its own for ever (``<id>-<uid>``). Existing rows get a fresh
uid each; those already claimed keep the folder recorded in ``run_path``."""

import uuid

from django.db import migrations, models


def fill_uids(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    for run in Run.objects.filter(uid__isnull=True).only("pk"):
        Run.objects.filter(pk=run.pk).update(uid=uuid.uuid4())


class Migration(migrations.Migration):
    dependencies = [("runs", "0004_run_remote_ids")]

    operations = [
        migrations.AddField(model_name="run", name="uid", field=models.UUIDField(null=True, editable=False)),
        migrations.RunPython(fill_uids, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="run", name="uid", field=models.UUIDField(default=uuid.uuid4, editable=False, unique=True),
        ),
    ]
