"""A monitor rule alerts once per crossing, not once per run: its outbox event names the crossing's
step (``monitor:<rule id>@<step>``, longer than the 20 characters the field had). The deliveries
already made (``monitor:<rule id>``) are given the step their title names, so the crossing they
told is not told again."""

import re

from django.db import migrations, models

TITLE_STEP = re.compile(r" at step (\d+)$")


def name_the_crossing_step(apps, schema_editor):
    AlertDelivery = apps.get_model("integrations", "AlertDelivery")
    for delivery in AlertDelivery.objects.filter(event__regex=r"^monitor:\d+$").only("event", "title"):
        step = TITLE_STEP.search(delivery.title)
        if step is not None:
            delivery.event = f"{delivery.event}@{step.group(1)}"
            delivery.save(update_fields=["event"])


def keep_the_first_crossing(apps, schema_editor):
    """Back to one delivery per monitor rule and run: the earliest crossing's keeps the old event,
    the later crossings' deliveries go (the earlier version has no place for them)."""
    AlertDelivery = apps.get_model("integrations", "AlertDelivery")
    seen = set()
    crossings = AlertDelivery.objects.filter(event__regex=r"^monitor:\d+@\d+$").only("rule_id", "run_id", "event")
    for delivery in sorted(crossings, key=lambda d: (d.rule_id, d.run_id, d.event.split("@")[0], int(d.event.split("@")[1]))):
        key = (delivery.rule_id, delivery.run_id, delivery.event.split("@")[0])
        if key in seen:
            delivery.delete()
            continue
        seen.add(key)
        delivery.event = key[2]
        delivery.save(update_fields=["event"])


class Migration(migrations.Migration):

    dependencies = [
        ("integrations", "0001_initial"),
    ]

    operations = [
        migrations.AlterField(
            model_name="alertdelivery",
            name="event",
            field=models.CharField(max_length=40),
        ),
        migrations.RunPython(name_the_crossing_step, keep_the_first_crossing),
    ]
