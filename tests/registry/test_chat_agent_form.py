"""Chat agents written in the browser by a project's members: AWorld's agent YAML fields (system
prompt, llm_config's model and temperature, tools among the administrators' list), never code."""

from __future__ import annotations

import pytest
from django.urls import reverse

from webapp.registry.models import Agent, Model, Tool


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def agent_data(registry, **extra):
    return {"name": "helper-bot", "description": "", "system_prompt": "Answer with the number alone.",
            "model": "tiny-char", "temperature": 0.7, "tools": [Tool.objects.get(name="add").pk], **extra}


def test_a_member_defines_a_chat_agent_with_aworlds_fields(page_client, teammate, project, registry):
    client = page_client(teammate)
    page = client.get(reverse("registry:agent_create", args=[project.pk])).content.decode()
    assert "add: Add two numbers." in page and "agent_class" not in page
    # A class path in the request is not a field of this form: it is ignored, never stored.
    response = client.post(reverse("registry:agent_create", args=[project.pk]),
                           agent_data(registry, agent_class="os.system", workflow_class="x.Y"))
    assert response.status_code == 302, response.content.decode()[-2000:]
    agent = Agent.objects.get(name="helper-bot")
    assert response["Location"].startswith(reverse("runs:create") + f"?agent={agent.pk}")
    assert (agent.kind, agent.project, agent.agent_class, agent.workflow_class) == ("chat", project, "", "")
    assert agent.trainer_kwargs() == {"agent": {"agents": {"helper-bot": {
        "system_prompt": "Answer with the number alone.",
        "llm_config": {"llm_model_name": "tiny-char", "llm_temperature": 0.7},
        "tool_names": ["examples.arithmetic.add"],
    }}}}
    listing = client.get(reverse("registry:project", args=[project.pk])).content.decode()
    assert "helper-bot" in listing


def test_the_form_names_what_is_wrong(page_client, owner, project, registry):
    Model.objects.create(name="their-model", source=Model.Source.BUILTIN, identifier="tiny-char",
                         project=_other_project())
    response = page_client(owner).post(reverse("registry:agent_create", args=[project.pk]), agent_data(
        registry, name="copy-task", system_prompt="", model="their-model", temperature=0))
    errors = response.context["form"].errors
    assert "taken" in errors["name"][0]
    assert errors["system_prompt"] and errors["temperature"]
    assert "Select a valid choice" in errors["model"][0]  # another project's model is not offered
    assert not Agent.objects.filter(project=project).exists()


def test_strangers_and_viewers_cannot_add_agents(page_client, stranger, viewer, project, registry):
    for person in (stranger, viewer):
        response = page_client(person).post(reverse("registry:agent_create", args=[project.pk]), agent_data(registry))
        assert response.status_code == 404
    assert not Agent.objects.filter(name="helper-bot").exists()


def test_a_run_of_the_agent_validates_in_the_run_form(page_client, owner, project, registry, no_queue):
    from webapp.runs.models import Run

    client = page_client(owner)
    created = client.post(reverse("registry:agent_create", args=[project.pk]), agent_data(registry))
    form_page = client.get(created["Location"]).content.decode()
    agent = Agent.objects.get(name="helper-bot")
    assert f'<option value="{agent.pk}" selected>' in form_page and '<option value="tiny-char" selected>' in form_page
    response = client.post(reverse("runs:create"), {
        "project": project.pk, "visibility": "team", "agent": agent.pk, "dataset": registry["datasets"]["arithmetic"].pk,
        "reward": registry["rewards"]["math"].pk, "backend": registry["backends"]["trl"].pk, "model": "tiny-char",
        "overrides": "trainer.total_training_steps=1\ndata.train_batch_size=2\nactor_rollout_ref.rollout.n=2\n",
    })
    assert response.status_code == 302, response.content.decode()[-3000:]
    assert Run.objects.get(agent=agent).project == project


def _other_project():
    from webapp.teams.models import Project, Team

    return Project.objects.create(team=Team.objects.create(name="Other", slug="other"), name="theirs")
