"""A loopback webhook receiver (apprise's json:// posts to it) and alert fixtures."""

from __future__ import annotations

import pytest
from standins.http import LoopbackServer, Response


class Receiver:
    """Answers each POST with the next status of ``statuses`` (then 200), keeping every body."""

    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.bodies: list[dict] = []
        self.server = LoopbackServer(self._handle)

    def _handle(self, request):
        self.bodies.append(request.json())
        return Response(self.statuses.pop(0) if self.statuses else 200, {})

    @property
    def target(self) -> str:
        host, port = self.server.httpd.server_address[:2]
        return f"json://{host}:{port}/hook"


@pytest.fixture
def receiver(settings):
    receiver = Receiver()
    host, port = receiver.server.httpd.server_address[:2]
    settings.EGRESS_ALLOWED_HOSTS = (f"{host}:{port}",)  # the receiver is on loopback: an admin allows it
    yield receiver
    receiver.server.close()


@pytest.fixture
def project_rule(project, owner):
    from webapp.integrations.models import AlertRule

    def make(target: str, events: list[str], **fields) -> AlertRule:
        rule = AlertRule(project=project, created_by=owner, events=events, **fields)
        rule.target = target
        rule.save()
        return rule

    return make
