"""Runs claimed before attempts were recorded (0016) have no ``RunAttempt`` row: each is given one,
its last attempt (number ``run.attempts``), from the run's own fields: the worker, when it started,
and, for a run that is no longer running, when and how it ended. Its start step is not known (0).
The rows it writes say so in their detail, which is how the way back finds them."""

from django.db import migrations

FROM_RUN = "From the run's row: "
FINAL_CAUSES = {"succeeded": "succeeded", "failed": "failed", "cancelled": "cancelled", "pruned": "cancelled"}


def attempts_from_runs(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    RunAttempt = apps.get_model("runs", "RunAttempt")
    unrecorded = Run.objects.filter(kind="platform", attempts__gt=0, attempt_rows__isnull=True)
    rows = []
    for run in unrecorded.iterator():
        error = (run.error.strip().splitlines() or [""])[0]
        if run.status == "running":  # its end is recorded on this row when it comes
            ended = {"ended_at": None, "end_step": None, "cause": ""}
        else:  # final, or queued again after it: it ended, how is known only of a final run
            ended = {"ended_at": run.finished_at or run.heartbeat_at or run.started_at or run.created_at,
                     "end_step": run.steps, "cause": FINAL_CAUSES.get(run.status, "")}
        detail = FROM_RUN + (error or f"attempt {run.attempts} of the run, as it was recorded before attempts were kept")
        rows.append(RunAttempt(run=run, number=run.attempts, worker=run.worker[:200], started_at=run.started_at or run.created_at,
                               start_step=0, detail=detail[:500], **ended))
    RunAttempt.objects.bulk_create(rows, batch_size=500)


def remove_attempts_from_runs(apps, schema_editor):
    apps.get_model("runs", "RunAttempt").objects.filter(detail__startswith=FROM_RUN).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0017_run_optimizer_state"),
    ]

    operations = [
        migrations.RunPython(attempts_from_runs, remove_attempts_from_runs),
    ]
