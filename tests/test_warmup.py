"""A web process does its first request's one-off work as it starts (``webapp.warmup``): after it,
the first run page compiles no template and builds no URL table. The same page without it does
both, which shows the check can fail."""

from __future__ import annotations

import pytest
from django.forms.renderers import get_default_renderer
from django.template import base, engines
from django.urls import clear_url_caches, resolvers

from webapp.warmup import warm_up

pytestmark = pytest.mark.django_db


def cold_process() -> None:
    """Forget what earlier requests of this test process compiled and built."""
    for engine in [*(e.engine for e in engines.all()), get_default_renderer().engine.engine]:
        for loader in engine.template_loaders:
            if hasattr(loader, "reset"):
                loader.reset()
    clear_url_caches()


@pytest.fixture
def first_request_work(monkeypatch):
    """Templates compiled and URL tables built while the test runs."""
    done = {"compiled": [], "url_tables": 0}
    compile_template, populate = base.Template.__init__, resolvers.URLResolver._populate

    def counted_compile(self, *args, **kwargs):
        compile_template(self, *args, **kwargs)
        done["compiled"].append(self.origin.name)

    def counted_populate(self):
        done["url_tables"] += 1
        populate(self)

    monkeypatch.setattr(base.Template, "__init__", counted_compile)
    monkeypatch.setattr(resolvers.URLResolver, "_populate", counted_populate)
    return done


def test_after_warm_up_the_first_run_page_compiles_nothing(owner_client, make_run, first_request_work):
    run = make_run()
    owner_client.get("/healthz")  # the test client loads its middleware on its first request; a server at start
    cold_process()
    first_request_work["compiled"].clear()
    first_request_work["url_tables"] = 0
    assert owner_client.get(f"/runs/{run.pk}/").status_code == 200
    assert first_request_work["compiled"] and first_request_work["url_tables"], "a cold page does both"

    cold_process()
    warm_up()
    first_request_work["compiled"].clear()
    first_request_work["url_tables"] = 0
    assert owner_client.get(f"/runs/{run.pk}/").status_code == 200
    assert owner_client.get(f"/runs/{run.pk}/").status_code == 200
    assert first_request_work == {"compiled": [], "url_tables": 0}
