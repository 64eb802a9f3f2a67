"""Every model has a working admin; admins enable and disable backends."""

import pytest

from webapp.registry.models import Backend

MODELS = ["registry/agent", "registry/tool", "registry/dataset", "registry/model", "registry/rewardfunction", "registry/backend",
          "runs/run", "runs/runlog", "runs/checkpoint", "checkpoints/checkpointalias", "checkpoints/evaluation"]


@pytest.mark.parametrize("model", MODELS)
def test_changelist_and_add_pages(admin_client_, registry, make_run, model):
    make_run()
    assert admin_client_.get(f"/admin/{model}/").status_code == 200
    assert admin_client_.get(f"/admin/{model}/add/").status_code == 200


def test_disable_backend_action(admin_client_, registry):
    trl = registry["backends"]["trl"]
    response = admin_client_.post("/admin/registry/backend/", {"action": "disable_backends", "_selected_action": [trl.pk]})
    assert response.status_code == 302
    assert Backend.objects.get(pk=trl.pk).enabled is False


def test_owner_cannot_use_admin(owner_client):
    assert owner_client.get("/admin/registry/backend/").status_code == 302
