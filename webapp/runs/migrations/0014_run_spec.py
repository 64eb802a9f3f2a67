from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0013_run_table"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="spec",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
