"""Reward-health monitors (``GET /api/runs/<id>/monitors/``): each monitor read from what a run
stored, a project's rules (``/api/monitor-rules/``, the integrations page) raising alerts, an
alert's evidence (``/api/runs/<id>/monitors/evidence/``), and who may read and change them."""

from __future__ import annotations

import pytest

from training.tracking.episodes import episode_record
from training.types import Episode, Step, Trajectory
from webapp.dashboard import episodes as episode_store
from webapp.monitors.models import MonitorRule
from webapp.runs.models import Run
from webapp.teams.models import Membership, Project, ShareLink, Team

MONITORS = "/api/runs/{}/monitors/"
EVIDENCE = "/api/runs/{}/monitors/evidence/"
RULES = "/api/monitor-rules/"


def record(step: int, position: int, row: int, reward: float, length: int = 2) -> dict:
    episode = Episode(
        task={"prompt": f"task {row}"},
        trajectories=[Trajectory(steps=[Step(chat_completions=[{"role": "user", "content": f"task {row}"}],
                                             model_response="ab", reward=reward, done=True)], reward=reward)],
        prompt_ids=[1], response_ids=[2] * length, response_mask=[1] * length,
    )
    stored = episode_record(episode, split="train", step=step, position=position, group=f"g{step}-{row}",
                            group_position=position % 2)
    stored["row_index"] = row
    return stored


def by_monitor(body: dict) -> dict:
    return {m["monitor"]: m for m in body["monitors"]}


@pytest.fixture
def audited_run(make_run, project, store, tmp_path, settings):
    """20 steps of metrics with a KL spike at 15, entropy falling from step 10, responses three times
    longer from step 12, a clip-fraction jump at 18, one reward component far above the other, and a
    validation reward well under the training reward."""
    settings.RUNS_DIR = tmp_path
    run = make_run(project=project, visibility=Run.Visibility.TEAM, run_path=str(tmp_path / "run-folder"))
    steps = range(1, 21)
    store(run, {
        "reward": [(s, 0.8) for s in steps],
        "kl": [(s, 0.2 if s == 15 else 0.01) for s in steps],
        "entropy": [(s, 1.0 if s < 10 else 0.2) for s in steps],
        "response_length": [(s, 10.0 if s < 12 else 30.0) for s in steps],
        "actor/pg_clipfrac": [(s, 0.5 if s == 18 else 0.1) for s in steps],
        "reward_components/format": [(s, 1.0) for s in steps],
        "reward_components/accuracy": [(s, 0.05) for s in steps],
        "val/math/reward": [(10, 0.3), (20, 0.7)],
    })
    return Run.objects.get(pk=run.pk)


def test_each_monitor_is_read_from_what_the_run_stored(audited_run, api_client, owner):
    response = api_client(owner).get(MONITORS.format(audited_run.pk))
    assert response.status_code == 200, response.content
    body = response.json()
    monitors = by_monitor(body)
    assert (body["step_min"], body["step_max"]) == (0, 20)
    kl = dict(zip(monitors["kl_spike"]["steps"], monitors["kl_spike"]["values"]))
    assert kl[15] == pytest.approx(20.0) and kl[14] == pytest.approx(1.0)
    assert monitors["clip_fraction_spike"]["source"] == "metric actor/pg_clipfrac"
    assert dict(zip(monitors["clip_fraction_spike"]["steps"], monitors["clip_fraction_spike"]["values"]))[18] == pytest.approx(5.0)
    # Entropy: the last 5 steps' mean (0.2) against the first 5's (1.0).
    assert monitors["entropy_collapse"]["latest"] == pytest.approx(0.8)
    assert monitors["response_length_drift"]["latest"] == pytest.approx(2.0)
    assert monitors["component_dominance"]["latest"] == pytest.approx(1.0 / 1.05)
    divergence = dict(zip(monitors["validation_divergence"]["steps"], monitors["validation_divergence"]["values"]))
    assert divergence == {10: pytest.approx(0.5), 20: pytest.approx(0.1)}
    # No episode stored: the all-equal share has nothing to be read from, and says so.
    assert monitors["all_equal_groups"]["source"] is None and monitors["all_equal_groups"]["steps"] == []
    assert body["alerts"] == [] and body["rules"] == []


def test_a_projects_rules_raise_alerts_at_the_first_step_of_each_stretch_above(audited_run, api_client, owner):
    client = api_client(owner)
    for monitor, threshold, window in (("kl_spike", 5, 5), ("entropy_collapse", 0.5, 3), ("validation_divergence", 0.3, 5)):
        made = client.post(RULES, {"project": audited_run.project_id, "monitor": monitor, "threshold": threshold, "window": window},
                           format="json")
        assert made.status_code == 201, made.content
    alerts = [(a["monitor"], a["step"]) for a in client.get(MONITORS.format(audited_run.pk)).json()["alerts"]]
    # Entropy over 3 steps: (1.0 + 0.2 + 0.2) / 3 against 1.0 is 0.53 at step 11, first above 0.5.
    assert alerts == [("validation_divergence", 10), ("entropy_collapse", 11), ("kl_spike", 15)]
    rule = MonitorRule.objects.get(monitor="kl_spike")
    assert client.patch(f"{RULES}{rule.pk}/", {"enabled": False}, format="json").status_code == 200
    assert "kl_spike" not in [a["monitor"] for a in client.get(MONITORS.format(audited_run.pk)).json()["alerts"]]


def test_the_all_equal_share_and_an_alerts_evidence_from_the_episode_store(make_run, project, api_client, owner, tmp_path, settings):
    settings.RUNS_DIR = tmp_path
    run = make_run(project=project, visibility=Run.Visibility.TEAM, run_path=str(tmp_path / "run-folder"))
    # Rows 1 and 2 at steps 1..8; from step 7 every group's rewards are all equal.
    for step in range(1, 9):
        equal = step >= 7
        episode_store.store_step(run.pk, 1, step, [
            record(step, 0, 1, 1.0), record(step, 1, 1, 1.0 if equal else 0.0, length=9 if equal else 2),
            record(step, 2, 2, 0.5), record(step, 3, 2, 0.5 if equal else 0.0),
        ])
    client = api_client(owner)
    assert client.post(RULES, {"project": project.pk, "monitor": "all_equal_groups", "threshold": 0.5, "window": 1},
                       format="json").status_code == 201
    body = client.get(MONITORS.format(run.pk)).json()
    assert by_monitor(body)["all_equal_groups"]["source"] == "stored episodes"
    assert by_monitor(body)["response_length_drift"]["source"] == "stored episodes"  # no response_length metric
    assert [(a["monitor"], a["step"]) for a in body["alerts"]] == [("all_equal_groups", 7)]
    evidence = client.get(EVIDENCE.format(run.pk), {"step": 7, "window": 5}).json()
    prompts = {p["prompt"]: p for p in evidence["prompts"]}
    assert sorted(prompts) == ["dataset row 1", "dataset row 2"]
    # The same prompts at least 5 steps back: step 2.
    assert {p["earlier_step"] for p in prompts.values()} == {2}
    assert [e["reward"] for e in prompts["dataset row 1"]["episodes"]] == [1.0, 1.0]
    assert [e["reward"] for e in prompts["dataset row 1"]["earlier"]] == [1.0, 0.0]
    assert all(e["step"] == 2 for e in prompts["dataset row 2"]["earlier"])
    # Nothing that far back: the newest earlier step.
    assert {p["earlier_step"] for p in client.get(EVIDENCE.format(run.pk), {"step": 3, "window": 5}).json()["prompts"]} == {2}
    assert client.get(EVIDENCE.format(run.pk), {"step": 1}).json()["prompts"][0]["earlier_step"] is None
    refused = client.get(EVIDENCE.format(run.pk), {"step": -1, "window": 1000})
    assert refused.status_code == 400 and {"step", "window"} <= set(refused.json())
    assert client.get(EVIDENCE.format(run.pk)).status_code == 400  # step is required


def test_who_may_read_and_change_monitors_and_rules(audited_run, api_client, owner, teammate, viewer, stranger):
    elsewhere = Team.objects.create(name="Other team", slug="other")
    Membership.objects.create(team=elsewhere, user=stranger, role=Membership.Role.OWNER)
    theirs = Project.objects.create(team=elsewhere, name="other")
    project = audited_run.project_id
    rule = {"project": project, "monitor": "kl_spike", "threshold": 5, "window": 5}
    # Runs: as every run resource.
    assert api_client(stranger).get(MONITORS.format(audited_run.pk)).status_code == 404
    assert api_client(stranger).get(EVIDENCE.format(audited_run.pk), {"step": 1}).status_code == 404
    assert api_client(None).get(MONITORS.format(audited_run.pk)).status_code in (401, 403)
    assert api_client(viewer).get(MONITORS.format(audited_run.pk)).status_code == 200
    link = ShareLink.objects.create(run=audited_run, created_by=owner)
    assert api_client(None).get(MONITORS.format(audited_run.pk), {"share": link.token}).status_code == 200
    link.revoke()
    assert api_client(None).get(MONITORS.format(audited_run.pk), {"share": link.token}).status_code == 404
    # Rules: a member or viewer reads them and changes none; a stranger neither sees nor makes any.
    assert api_client(teammate).post(RULES, rule, format="json").status_code == 403
    assert api_client(stranger).post(RULES, rule, format="json").status_code == 400
    made = api_client(owner).post(RULES, rule, format="json")
    assert made.status_code == 201
    url = f"{RULES}{made.json()['id']}/"
    assert [r["monitor"] for r in api_client(viewer).get(RULES).json()["results"]] == ["kl_spike"]
    assert api_client(stranger).get(RULES).json()["results"] == []
    assert api_client(stranger).get(url).status_code == 404
    assert api_client(stranger).delete(url).status_code == 404
    assert api_client(teammate).patch(url, {"threshold": 1}, format="json").status_code == 403
    assert api_client(teammate).delete(url).status_code == 403
    assert api_client(stranger).post(RULES, {**rule, "project": theirs.pk}, format="json").status_code == 201
    moved = api_client(owner).patch(url, {"project": theirs.pk}, format="json")
    assert moved.status_code == 400  # not the owner's project to see: refused as one that does not exist
    assert api_client(owner).post(RULES, rule, format="json").status_code == 400  # one rule per monitor
    for bad in ({"threshold": "nan"}, {"threshold": 1e9}, {"window": 0}, {"window": 101}, {"monitor": "vibes"}):
        refused = api_client(owner).post(RULES, {**rule, "monitor": "entropy_collapse", **bad}, format="json")
        assert refused.status_code == 400 and set(bad) <= set(refused.json()), (bad, refused.content)
    assert api_client(owner).delete(url).status_code == 204


def test_the_integrations_page_turns_a_rule_on_for_its_managers_only(audited_run, page_client, owner, teammate):
    project = audited_run.project_id
    url = f"/projects/{project}/integrations/monitors/"
    assert page_client(teammate).post(url, {"monitor": "kl_spike", "threshold": "5", "window": "5"}).status_code == 403
    refused = page_client(owner).post(url, {"monitor": "kl_spike", "threshold": "1e9", "window": "5"})
    assert refused.status_code == 200 and "finite number" in refused.content.decode()
    assert page_client(owner).post(url, {"monitor": "kl_spike", "threshold": "5", "window": "5"}).status_code == 302
    assert page_client(owner).post(url, {"monitor": "kl_spike", "threshold": "4", "window": "3"}).status_code == 302
    rule = MonitorRule.objects.get(project_id=project)
    assert (rule.monitor, rule.threshold, rule.window, rule.created_by) == ("kl_spike", 4.0, 3, owner)
    page = page_client(owner).get(f"/projects/{project}/integrations/").content.decode()
    assert 'id="monitor-rules-table"' in page and "KL spike" in page
    run_page = page_client(owner).get(f"/runs/{audited_run.pk}/").content.decode()
    assert 'id="run-monitors"' in run_page and "do not promise an early warning" in run_page
    assert page_client(teammate).post(f"/monitor-rules/{rule.pk}/delete/").status_code == 403
    assert page_client(owner).post(f"/monitor-rules/{rule.pk}/delete/").status_code == 302
    assert not MonitorRule.objects.exists()
