"""What a web process would otherwise do on its first request, done as it starts (``webapp/asgi.py``,
``webapp/wsgi.py``): import every view (loading the URLconf imports them, and with them DRF and the
other libraries they use), build the URL resolvers' reverse tables (the first ``{% url %}`` built
them: ~1,400 regular expressions), import what the first request imported (number formats, message
storage, session engine, context processors), build the models' field maps, and compile the
project's templates and Django's form templates into their cached loaders. Without it the first
view of a run page after a start took 0.25 s on a quiet machine here and 2.7 s on a loaded one,
against ~9 ms for the next (bench/scale.py, ``runpage``)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

logger = logging.getLogger(__name__)


def warm_up() -> float:
    """Import the views, build the URL tables, compile the templates. Returns the seconds it took."""
    from importlib import import_module

    from django.apps import apps
    from django.conf import settings
    from django.forms.renderers import get_default_renderer
    from django.template import engines
    from django.urls import get_resolver
    from django.utils import formats
    from django.utils.module_loading import import_string

    started = time.perf_counter()
    _build_url_tables(get_resolver())
    formats.number_format(0.5)  # imports the locale's format module, which the first number shown did
    import_string(settings.MESSAGE_STORAGE)
    import_module(settings.SESSION_ENGINE)
    import_module("django.contrib.sessions.exceptions")
    for model in apps.get_models():  # the field maps and reverse relations queries resolve names with
        model._meta.get_fields()
        model._meta.fields_map, model._meta._forward_fields_map  # noqa: B018
    for engine in engines.all():
        getattr(engine, "engine", engine).template_context_processors  # noqa: B018 (imports them)
    project = Path(settings.BASE_DIR).resolve()
    for engine in engines.all():
        for folder in map(Path, getattr(engine, "template_dirs", ())):
            if project in folder.resolve().parents:  # not the admin's many templates, rarely shown
                _compile(engine, folder, "*")
    forms = get_default_renderer().engine
    for folder in map(Path, getattr(forms, "template_dirs", ())):
        if (folder / "django" / "forms").is_dir():
            _compile(forms, folder, "django/forms/**/*.html")
    took = time.perf_counter() - started
    logger.info("views imported, URL tables built and templates compiled in %.2f s", took)
    return took


def _build_url_tables(resolver, namespace: str = "") -> None:
    """The root's reverse tables, then each namespace's: ``reverse("ns:name")`` builds (and caches)
    a resolver of its own per namespace, so one name of each is reversed (arguments or not)."""
    from django.urls import NoReverseMatch, reverse

    resolver.reverse_dict  # noqa: B018 (building it is the point)
    for name, (_, inner) in resolver.namespace_dict.items():
        path = f"{namespace}{name}"
        names = [n for n in inner.reverse_dict if isinstance(n, str)]
        if names:
            try:
                reverse(f"{path}:{names[0]}")
            except NoReverseMatch:
                pass  # it needs arguments: the namespace's tables are built all the same
        _build_url_tables(inner, f"{path}:")


def _compile(engine, folder: Path, pattern: str) -> None:
    for path in sorted(folder.rglob(pattern) if pattern == "*" else folder.glob(pattern)):
        if path.is_file():
            engine.get_template(path.relative_to(folder).as_posix())
