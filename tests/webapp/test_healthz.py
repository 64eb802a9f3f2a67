import pytest

import webapp.health


@pytest.mark.django_db
def test_healthz_reports_database_and_broker(client):
    response = client.get("/healthz")
    assert response.status_code == 200, response.content
    assert response.json() == {"status": "ok", "database": "ok", "broker": "ok"}


@pytest.mark.django_db
def test_healthz_is_503_when_the_broker_is_down(client, monkeypatch):
    monkeypatch.setattr(webapp.health, "_broker_state", lambda: "error: ConnectionRefusedError")
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["broker"].startswith("error")
    assert response.json()["database"] == "ok"
