"""Creating a run over the API while the database does not answer: a clear 503 saying nothing was
recorded (the broker is never involved in creating a run: see test_data_flow)."""

from django.db import OperationalError

from webapp.runs.models import Run


def test_a_run_that_could_not_be_recorded_is_a_503_not_a_500(owner, api_client, monkeypatch):
    def database_gone(*args, **kwargs):
        raise OperationalError("connection to server at 127.0.0.1 port 5432 failed: Connection refused")

    monkeypatch.setattr(Run.objects, "create", database_gone)
    response = api_client(owner).post("/api/runs/", {"kind": "external", "name": "notebook"}, format="json")
    assert response.status_code == 503 and response["Retry-After"] == "10"
    assert "nothing was recorded" in response.json()["detail"]
