"""The second level of the metric store: one ``SeriesSummary`` row per 64 blocks of a key, built
here for every run stored before it (the fold keeps them from then on). The summary is computed
here, not imported, so that this migration keeps working whatever the store's module becomes.
Backward, the table is dropped: the blocks hold everything."""

import django.db.models.deletion
from django.db import migrations, models

SUMMARY_BLOCKS = 64
COLUMNS = ("first_step", "last_step", "count", "min_value", "min_step", "max_value", "max_step", "last_value")


def _summary(SeriesSummary, run_id, key, group, blocks):
    """The summary of block rows (``COLUMNS``, in index order): their step range and count, the
    lowest minimum and highest maximum (the earlier block on a tie), the value at the highest step."""
    lows = [b for b in blocks if b[3] is not None]
    highs = [b for b in blocks if b[5] is not None]
    low = min(lows, key=lambda b: b[3]) if lows else (None,) * 5
    high = max(highs, key=lambda b: b[5]) if highs else (None,) * 7
    last = max(blocks, key=lambda b: b[1])
    return SeriesSummary(run_id=run_id, key=key, index=group, blocks=len(blocks),
                         first_step=min(b[0] for b in blocks), last_step=last[1], count=sum(b[2] for b in blocks),
                         min_value=low[3], min_step=low[4], max_value=high[5], max_step=high[6], last_value=last[7])


def build_summaries(apps, schema_editor):
    SeriesBlock = apps.get_model("dashboard", "SeriesBlock")
    SeriesSummary = apps.get_model("dashboard", "SeriesSummary")
    rows, current, blocks = [], None, []
    query = SeriesBlock.objects.order_by("run_id", "key", "index").values_list("run_id", "key", "index", *COLUMNS)
    for run_id, key, index, *columns in query.iterator(chunk_size=5000):
        group = (run_id, key, index // SUMMARY_BLOCKS)
        if group != current:
            if blocks:
                rows.append(_summary(SeriesSummary, *current, blocks))
            current, blocks = group, []
        blocks.append(tuple(columns))
        if len(rows) >= 1000:
            SeriesSummary.objects.bulk_create(rows)
            rows = []
    if blocks:
        rows.append(_summary(SeriesSummary, *current, blocks))
    SeriesSummary.objects.bulk_create(rows)


class Migration(migrations.Migration):

    dependencies = [
        ('dashboard', '0003_metricpoints_into_blocks'),
        ('runs', '0010_delete_metricpoint'),
    ]

    operations = [
        migrations.CreateModel(
            name='SeriesSummary',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=200)),
                ('index', models.PositiveIntegerField(help_text='Block index // SUMMARY_BLOCKS')),
                ('blocks', models.PositiveIntegerField(help_text='How many blocks it summarises (the last one may be partial)')),
                ('first_step', models.BigIntegerField()),
                ('last_step', models.BigIntegerField()),
                ('count', models.BigIntegerField()),
                ('min_value', models.FloatField(null=True)),
                ('min_step', models.BigIntegerField(null=True)),
                ('max_value', models.FloatField(null=True)),
                ('max_step', models.BigIntegerField(null=True)),
                ('last_value', models.FloatField(null=True)),
                ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='series_summaries', to='runs.run')),
            ],
            options={
                'ordering': ['run', 'key', 'index'],
                'constraints': [models.UniqueConstraint(fields=('run', 'key', 'index'), name='unique_series_summary')],
            },
        ),
        migrations.RunPython(build_summaries, migrations.RunPython.noop),
    ]
