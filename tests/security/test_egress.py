"""Outbound URLs a person chose (webhooks, MLflow and W&B servers) never reach the platform's own
network: each attack is replayed through the form a team admin or member uses, then through the
worker's code path (alert delivery, a run's training process), against a listener on loopback
that must receive nothing and whose answer must appear nowhere a member reads.

DNS rebinding is simulated by answering a name with a public address first and loopback after:
``socket.getaddrinfo`` itself is patched, so a client that resolved the name on its own (bypassing
the guard's proxy) would reach the listener and fail the test.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from standins.http import LoopbackServer, Response

from training.isolation import egress
from webapp.integrations.alerts import deliver_due
from webapp.integrations.models import AlertDelivery, AlertRule, TrackingTarget
from webapp.integrations.secrets import seal
from webapp.runs.models import Run, RunLog

ANSWER = "internal-answer-5f1c: redis keys and metadata credentials"
PUBLIC = "93.184.216.34"


@pytest.fixture
def listener():
    """Something on loopback a member would like to reach; it answers with text that must never be shown."""
    server = LoopbackServer(lambda request: Response(200, {"detail": ANSWER}))
    server.port = server.httpd.server_address[1]
    yield server
    server.close()


@pytest.fixture
def rebinding(monkeypatch):
    """``rebinding(name, public_answers)``: ``name`` resolves to a public address for its first
    ``public_answers`` lookups, then to 127.0.0.1. Other names resolve as usual."""
    real = socket.getaddrinfo

    def make(name: str, public_answers: int) -> None:
        answers = {"left": public_answers}

        def getaddrinfo(host, port, *args, **kwargs):
            if host != name:
                return real(host, port, *args, **kwargs)
            address = PUBLIC if answers["left"] > 0 else "127.0.0.1"
            answers["left"] -= 1
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port or 80)))]

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)

    return make


def admin_of(team):
    from django.contrib.auth import get_user_model

    from webapp.teams.models import Membership

    user = get_user_model().objects.create_user(username="team-admin", password=None)
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    return user


def member_reads(client, run) -> str:
    """Everything a member reads about a run: its page, error, traceback and log lines."""
    run.refresh_from_db()
    logs = "\n".join(RunLog.objects.filter(run=run).values_list("message", flat=True))
    return "\n".join([client.get(f"/runs/{run.pk}/").content.decode(), run.error, run.traceback, logs])


# -- the guard itself ---------------------------------------------------------------------------

@pytest.mark.parametrize("address, kind", [
    ("127.0.0.1", "a loopback"), ("::1", "a loopback"), ("::ffff:127.0.0.1", "a loopback"),
    ("::ffff:10.0.0.7", "a private"), ("10.1.2.3", "a private"), ("192.168.0.10", "a private"),
    ("172.16.5.4", "a private"), ("fc00::1", "a private"), ("169.254.169.254", "a link-local"),
    ("fe80::1", "a link-local"), ("64:ff9b::a9fe:a9fe", "a link-local"), ("2002:7f00:1::", "a loopback"),
    ("0.0.0.0", "an unspecified"), ("::", "an unspecified"), ("224.0.0.1", "a multicast"), ("ff02::1", "a multicast"),
    ("240.0.0.1", "a reserved"), ("100.64.0.1", "a shared (carrier-grade NAT)"), ("8.8.8.8", None), ("2606:4700::1111", None),
])
def test_the_guard_names_every_kind_of_internal_address(address, kind):
    assert egress.why_not_public(address) == kind


def test_allowed_hosts_are_host_or_host_port_and_a_bad_entry_is_named(monkeypatch):
    assert egress.parse_allowed_hosts(" Mlflow.Internal , 10.0.0.5:5000,[::1]:8080 ") == ("mlflow.internal", "10.0.0.5:5000", "[::1]:8080")
    with pytest.raises(ValueError, match="'http://x/' is not a host or host:port"):
        egress.parse_allowed_hosts("http://x/")
    guard = egress.Guard(allowed=("127.0.0.1:9",))
    assert guard.addresses("127.0.0.1", 9) == ["127.0.0.1"]
    with pytest.raises(egress.EgressRefused, match="127.0.0.1 is a loopback address"):
        guard.addresses("127.0.0.1", 10)  # another port of an allowed host is not allowed

    from django.core.exceptions import ImproperlyConfigured

    from webapp.settings import envhosts

    monkeypatch.setenv("EGRESS_ALLOWED_HOSTS", "mlflow.internal,not a host")
    with pytest.raises(ImproperlyConfigured, match="EGRESS_ALLOWED_HOSTS: 'not a host' is not a host or host:port"):
        envhosts("EGRESS_ALLOWED_HOSTS")


# -- webhooks -----------------------------------------------------------------------------------

def test_a_team_admin_cannot_save_webhooks_to_internal_addresses_or_with_options(client, team, project, listener, settings):
    settings.EGRESS_ALLOWED_HOSTS = ()
    client.force_login(admin_of(team))
    port = listener.port
    for target, message in [
        # urlsplit reads the last '@' (a public host), apprise the first: apprise's reading is judged.
        (f"json://a@127.0.0.1:{port}@{PUBLIC}/", "127.0.0.1 is a loopback address"),
        (f"json://[::ffff:127.0.0.1]:{port}/hook", "apprise cannot use this json:// URL"),  # apprise reads no mapped IPv6
        (f"jsons://[::1]:{port}/hook", "::1 is a loopback address"),
        (f"json://0.0.0.0:{port}/hook", "0.0.0.0 is an unspecified address"),
        ("json://169.254.169.254/latest/meta-data", "169.254.169.254 is a link-local address"),
        ("form://10.0.0.7:6379/", "10.0.0.7 is a private address"),
        (f"json://{PUBLIC}/hook?method=GET", "Options after '?' are not accepted"),
        (f"json://{PUBLIC}/hook?+X-Forwarded-For=127.0.0.1", "Options after '?' are not accepted"),
        (f"json://{PUBLIC}/hook?rto=600&cto=600", "Options after '?' are not accepted"),
        (f"jsons://{PUBLIC}/hook?verify=no", "Options after '?' are not accepted"),
    ]:
        response = client.post(f"/projects/{project.pk}/integrations/alerts/", {"target": target, "events": ["failed"]})
        assert response.status_code == 200, target
        errors = " ".join(response.context["rule_form"].errors.get("target", []))
        assert message in errors, (target, errors)
    assert AlertRule.objects.count() == 0 and listener.calls == []


def test_a_member_cannot_save_a_loopback_webhook_as_their_own_alert(client, teammate, listener, settings):
    settings.EGRESS_ALLOWED_HOSTS = ()
    client.force_login(teammate)
    response = client.post("/alerts/", {"target": f"json://127.0.0.1:{listener.port}/hook", "events": ["failed"]})
    assert response.status_code == 200
    assert "refused by the egress guard: 127.0.0.1 is a loopback address" in response.content.decode()
    assert AlertRule.objects.count() == 0 and listener.calls == []


def test_a_webhook_saved_public_that_rebinds_to_loopback_is_refused_when_sent(
        client, team, project, make_run, listener, settings, rebinding):
    settings.EGRESS_ALLOWED_HOSTS = ()
    # Public when the form checks it and when the sender checks it; loopback when connected to.
    rebinding("hooks.rebind.test", public_answers=2)
    admin = admin_of(team)
    client.force_login(admin)
    target = f"json://hooks.rebind.test:{listener.port}/hook"
    assert client.post(f"/projects/{project.pk}/integrations/alerts/", {"target": target, "events": ["failed"]}).status_code == 302
    assert AlertRule.objects.get().target == target

    run = make_run(project=project, visibility="team")
    assert run.claim("w")
    run.finish("failed", error="boom")
    assert deliver_due() == {"sent": 0, "retry": 1, "failed": 0}
    assert listener.calls == []
    delivery = AlertDelivery.objects.get()
    assert "refused by the egress guard: hooks.rebind.test resolves to 127.0.0.1, which is a loopback address" in delivery.last_error
    page = client.get(f"/projects/{project.pk}/integrations/").content.decode()
    assert "which is a loopback address" in page and ANSWER not in page


def test_a_webhook_at_an_internal_address_stored_before_the_guard_is_refused_when_sent(
        project, owner, make_run, listener, settings):
    settings.EGRESS_ALLOWED_HOSTS = ()
    rule = AlertRule(project=project, created_by=owner, events=["failed"])
    rule.target_sealed = seal(f"json://127.0.0.1:{listener.port}/hook?method=GET")  # as stored before the guard
    rule.target_label = "json://127.0.0.1/…"
    rule.save()
    run = make_run(project=project, visibility="team")
    assert run.claim("w")
    run.finish("failed", error="boom")
    deliver_due()
    assert listener.calls == []
    assert "refused by the egress guard: 127.0.0.1 is a loopback address" in AlertDelivery.objects.get().last_error


def test_an_allowed_host_reaches_the_loopback_receiver_and_a_failure_is_told_by_status_code(
        client, team, project, make_run, settings):
    from django.utils import timezone

    bodies = []
    statuses = [502]

    def receive(request):
        bodies.append(request.json())
        return Response(statuses.pop(0) if statuses else 200, {"detail": ANSWER})

    receiver = LoopbackServer(receive)
    try:
        settings.EGRESS_ALLOWED_HOSTS = (f"127.0.0.1:{receiver.httpd.server_address[1]}",)
        client.force_login(admin_of(team))
        target = f"json://127.0.0.1:{receiver.httpd.server_address[1]}/hook"
        assert client.post(f"/projects/{project.pk}/integrations/alerts/", {"target": target, "events": ["failed"]}).status_code == 302
        run = make_run(project=project, visibility="team", name="lake")
        assert run.claim("w")
        run.finish("failed", error="boom")
        assert deliver_due()["retry"] == 1
        delivery = AlertDelivery.objects.get()
        assert delivery.last_error.endswith("the server answered HTTP 502.") and ANSWER not in delivery.last_error
        assert deliver_due(now=timezone.now() + timedelta(hours=1))["sent"] == 1
        assert bodies[-1]["title"] == f"[failed] run #{run.pk} lake"
    finally:
        receiver.close()


# -- tracking servers ---------------------------------------------------------------------------

def save_tracking(client, project, **fields):
    data = {"wandb_project": "lake-rl", "wandb_entity": "", "wandb_base_url": "", "mlflow_tracking_uri": "",
            "mlflow_username": "", "wandb_api_key": "", "mlflow_password": "", **fields}
    return client.post(f"/projects/{project.pk}/integrations/tracking/", data)


def test_a_team_admin_cannot_point_trackers_at_internal_addresses(client, team, project, listener, settings):
    settings.EGRESS_ALLOWED_HOSTS = ()
    client.force_login(admin_of(team))
    for field, url, message in [
        ("mlflow_tracking_uri", f"http://127.0.0.1:{listener.port}", "127.0.0.1 is a loopback address"),
        ("mlflow_tracking_uri", "http://[::ffff:169.254.169.254]/", "::ffff:169.254.169.254 is a link-local address"),
        ("mlflow_tracking_uri", "http://10.0.0.7:5000", "10.0.0.7 is a private address"),
        ("wandb_base_url", f"http://[::1]:{listener.port}", "::1 is a loopback address"),
        ("wandb_base_url", "http://169.254.169.254", "169.254.169.254 is a link-local address"),
    ]:
        response = save_tracking(client, project, **{field: url})
        assert response.status_code == 200, url
        errors = " ".join(response.context["tracking_form"].errors.get(field, []))
        assert f"refused by the egress guard: {message}" in errors, (url, errors)
    assert not TrackingTarget.objects.exists() and listener.calls == []


def run_with_mlflow_at(project, make_run, uri: str, settings, tmp_path):
    settings.RUNS_DIR = tmp_path
    TrackingTarget.objects.create(project=project, mlflow_tracking_uri=uri)
    run = make_run(project=project, visibility="team")
    assert run.claim("w")
    return run


# The recorder writes from its own thread and connection: the rows must be committed.
@pytest.mark.django_db(transaction=True)
def test_an_mlflow_server_at_loopback_fails_the_run_in_our_words_and_receives_nothing(
        project, make_run, listener, settings, tmp_path, owner_client):
    from workers.execute import train_run

    settings.EGRESS_ALLOWED_HOSTS = ()
    # A target stored before the guard existed: the run's training process judges it again.
    run = run_with_mlflow_at(project, make_run, f"http://127.0.0.1:{listener.port}", settings, tmp_path)
    assert train_run(run.pk) == Run.Status.FAILED
    shown = member_reads(owner_client, run)
    assert f"MLflow at http://127.0.0.1:{listener.port}: refused by the egress guard: 127.0.0.1 is a loopback address" in run.error
    assert listener.calls == [] and ANSWER not in shown


# The recorder writes from its own thread and connection: the rows must be committed.
@pytest.mark.django_db(transaction=True)
def test_an_mlflow_server_that_rebinds_to_loopback_is_refused_by_the_proxy(
        client, team, project, make_run, listener, settings, tmp_path, rebinding, monkeypatch, owner_client):
    from workers.execute import train_run

    settings.EGRESS_ALLOWED_HOSTS = ()
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the refusal is final: no backoff to wait through
    # Public for the form and for the tracker's own check; loopback when MLflow's request connects.
    rebinding("mlflow.rebind.test", public_answers=2)
    client.force_login(admin_of(team))
    uri = f"http://mlflow.rebind.test:{listener.port}"
    assert save_tracking(client, project, wandb_project="", mlflow_tracking_uri=uri).status_code == 302
    settings.RUNS_DIR = tmp_path
    run = make_run(project=project, visibility="team")
    assert run.claim("w")
    assert train_run(run.pk) == Run.Status.FAILED
    run.refresh_from_db()
    assert ("refused by the egress guard: mlflow.rebind.test resolves to 127.0.0.1, which is a loopback address"
            in run.error), run.error
    assert listener.calls == [] and ANSWER not in member_reads(owner_client, run)


class MlflowServer:
    """An MLflow tracking server's REST API, as far as a run uses it (experiments, runs, batches,
    proxied artifacts), on loopback. It keeps the metrics each run logged."""

    def __init__(self) -> None:
        self.metrics: list[dict] = []
        self.artifacts: list[str] = []
        self.server = LoopbackServer(self.handle)
        handler = self.server.httpd.RequestHandlerClass
        handler.do_PUT = handler.do_POST  # artifacts are PUT
        self.url = self.server.url

    def handle(self, request):
        api = request.path.removeprefix("/api/2.0/mlflow/")
        info = {"run_id": "r1", "run_uuid": "r1", "experiment_id": "1", "status": "RUNNING",
                "artifact_uri": "mlflow-artifacts:/1/r1/artifacts", "lifecycle_stage": "active"}
        if api == "experiments/get-by-name":
            return Response(404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no such experiment"})
        if api == "experiments/create":
            return Response(200, {"experiment_id": "1"})
        if api in ("runs/create", "runs/get"):
            return Response(200, {"run": {"info": info, "data": {}}})
        if api == "runs/log-batch":
            self.metrics += request.json().get("metrics", [])
            return Response(200, {})
        if api == "runs/update":
            return Response(200, {"run_info": {**info, "status": request.json().get("status", "RUNNING")}})
        if request.path.startswith("/api/2.0/mlflow-artifacts/artifacts/"):
            self.artifacts.append(request.path)
            return Response(200, {})
        return Response(404, {"error_code": "ENDPOINT_NOT_FOUND", "message": request.path})


# The recorder writes from its own thread and connection: the rows must be committed.
@pytest.mark.django_db(transaction=True)
def test_an_allowed_mlflow_server_on_loopback_gets_the_runs_metrics_through_the_guard(
        client, team, project, make_run, settings, tmp_path):
    from workers.execute import train_run

    mlflow = MlflowServer()
    try:
        settings.EGRESS_ALLOWED_HOSTS = (f"127.0.0.1:{mlflow.server.httpd.server_address[1]}",)
        client.force_login(admin_of(team))
        assert save_tracking(client, project, wandb_project="", mlflow_tracking_uri=mlflow.url).status_code == 302
        settings.RUNS_DIR = tmp_path
        run = make_run(project=project, visibility="team")
        assert run.claim("w")
        assert train_run(run.pk) == Run.Status.SUCCEEDED, Run.objects.get(pk=run.pk).error
        assert {m["step"] for m in mlflow.metrics if m["key"] == "reward"} == {1, 2}
        assert mlflow.artifacts  # sampled episodes, through the server's proxied artifact store
        assert ("POST", "/api/2.0/mlflow/runs/update") in mlflow.server.calls  # the run was finished there
    finally:
        mlflow.server.close()


def test_wandb_core_sends_through_the_guard_so_a_rebinding_server_is_refused(listener, tmp_path, monkeypatch):
    """wandb-core (W&B's Go service) makes the calls: the guard's check passes (a public answer),
    then wandb-core connects through the proxy, which judges the address again. Were wandb-core to
    connect on its own, it would reach the listener."""
    from training.config import Config
    from training.tracking.trackers import WandbSink
    from training.errors import TrackerError

    real = egress.resolve
    answers = iter([[PUBLIC]])
    monkeypatch.setattr(egress, "resolve", lambda host, port: next(answers, None) or real(host, port))
    monkeypatch.setenv("EGRESS_ALLOWED_HOSTS", "")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{listener.port}")
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "30")
    config = Config.build({"trainer.project_name": "lake", "trainer.logger": ["wandb"]})
    with pytest.raises(TrackerError) as refused:
        WandbSink(config, tmp_path)
    assert str(refused.value) == (f"W&B at http://127.0.0.1:{listener.port}, starting the run: refused by the egress guard: "
                                  "127.0.0.1 is a loopback address (an admin may allow its host in EGRESS_ALLOWED_HOSTS).")
    assert listener.calls == []


def test_wandb_at_an_allowed_host_is_reached_and_its_answer_is_not_repeated(tmp_path, monkeypatch):
    from training.config import Config
    from training.tracking.trackers import WandbSink
    from training.errors import TrackerError

    server = LoopbackServer(lambda request: Response(401, {"errors": [{"message": ANSWER}]}))
    try:
        port = server.httpd.server_address[1]
        monkeypatch.setenv("EGRESS_ALLOWED_HOSTS", f"127.0.0.1:{port}")
        monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
        monkeypatch.setenv("WANDB_BASE_URL", server.url)
        monkeypatch.setenv("WANDB_INIT_TIMEOUT", "30")
        config = Config.build({"trainer.project_name": "lake", "trainer.logger": ["wandb"]})
        with pytest.raises(TrackerError) as failed:
            WandbSink(config, tmp_path)
        assert ("POST", "/graphql") in server.calls  # wandb-core reached the allowed stand-in through the proxy
        assert str(failed.value) == (f"W&B at {server.url}, starting the run: it failed (CommError; the server's answer is "
                                     "not shown here)")  # wandb's own error is the server's text
    finally:
        server.close()


def test_verl_gets_the_guards_proxy_for_wandb_and_no_unallowed_mlflow_server(tmp_path, monkeypatch):
    from training.config import Config
    from training.tracking.trackers import verl_tracking_environment
    from training.errors import TrackerError

    monkeypatch.setenv("EGRESS_ALLOWED_HOSTS", "")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    config = Config.build({"trainer.logger": ["wandb"]})
    with pytest.raises(TrackerError, match="127.0.0.1 is a loopback address"):
        verl_tracking_environment(config, tmp_path)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://{PUBLIC}")
    env = verl_tracking_environment(config, tmp_path)
    assert env["WANDB_HTTPS_PROXY"] == env["WANDB_HTTP_PROXY"] and env["WANDB_HTTP_PROXY"].startswith("http://127.0.0.1:")
    with pytest.raises(TrackerError, match="only a server whose host an admin allowed"):
        verl_tracking_environment(Config.build({"trainer.logger": ["mlflow"], "trainer.mlflow_tracking_uri": f"http://{PUBLIC}"}), tmp_path)
    monkeypatch.setenv("EGRESS_ALLOWED_HOSTS", PUBLIC)
    assert verl_tracking_environment(Config.build({"trainer.logger": ["mlflow"], "trainer.mlflow_tracking_uri": f"http://{PUBLIC}"}),
                                     tmp_path)["MLFLOW_TRACKING_URI"] == f"http://{PUBLIC}"
