import django.db.models.deletion
from django.db import migrations, models


def add_tiny_char(apps, schema_editor):
    """Runs made before models were registry entries named 'tiny-char'; keep them runnable."""
    Model = apps.get_model("registry", "Model")
    Model.objects.get_or_create(name="tiny-char", defaults={"source": "builtin", "identifier": "tiny-char"})


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0004_backend_python"),
        ("teams", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Model",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.SlugField(max_length=100, unique=True)),
                ("description", models.TextField(blank=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("source", models.CharField(choices=[("builtin", "Built in code (tiny-char)"), ("hub", "Hugging Face hub id"), ("path", "Directory under MODEL_ROOTS")], default="hub", max_length=20)),
                ("identifier", models.CharField(help_text="tiny-char, a hub id (Qwen/Qwen2.5-0.5B) or an absolute directory.", max_length=500)),
                ("tokenizer", models.CharField(blank=True, help_text="Hub id or directory under MODEL_ROOTS; empty: the model's own.", max_length=500)),
                ("trust_remote_code", models.BooleanField(default=False, help_text="Let this model's own Python code (config.json auto_map) run on the workers. Only for code an administrator has read: no run can turn this on.")),
                ("project", models.ForeignKey(blank=True, help_text="Empty: shared with everyone on the platform.", null=True, on_delete=django.db.models.deletion.PROTECT, related_name="+", to="teams.project")),
            ],
            options={"ordering": ["name"], "abstract": False},
        ),
        migrations.RunPython(add_tiny_char, migrations.RunPython.noop),
    ]
