from django.core.management.base import BaseCommand

from webapp.registry.seed import seed_registry


class Command(BaseCommand):
    help = "Create (or update) the registry rows for the examples: agents, datasets, rewards, backends."

    def add_arguments(self, parser):
        parser.add_argument("--enable-gpu-backends", action="store_true", help="Enable the GPU backends (verl) too.")

    def handle(self, *args, **options):
        counts = seed_registry(enable_gpu_backends=options["enable_gpu_backends"])
        self.stdout.write(", ".join(f"{n} {name}(s)" for name, n in counts.items()) + " seeded.")
