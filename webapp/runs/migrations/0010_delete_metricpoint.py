from django.db import migrations


class Migration(migrations.Migration):
    """Metric points live in the metric store alone (``dashboard.SeriesBlock``/``SeriesTail``); the
    rows were moved there by ``dashboard.0003_metricpoints_into_blocks``."""

    dependencies = [
        ('runs', '0009_run_latest_values'),
        ('dashboard', '0003_metricpoints_into_blocks'),
    ]

    operations = [
        migrations.DeleteModel(
            name='MetricPoint',
        ),
    ]
