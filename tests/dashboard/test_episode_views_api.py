"""The episode views' API: one step's reward histogram whose bins open exactly their episodes through
the listing's filters, one prompt across training (``row_index``), the retokenization drift filter;
access as every run resource and bounds on every parameter."""

from __future__ import annotations

import pytest

from training.tracking.episodes import episode_record
from training.types import Episode, Step, Trajectory
from webapp.dashboard import episodes as episode_store
from webapp.runs.models import Run
from webapp.teams.models import Membership, Project, ShareLink, Team

URL = "/api/runs/{}/episodes/"
HISTOGRAM = "/api/runs/{}/episodes/histogram/"
# Step 2's rewards: in 4 bins over [0, 1] they fall 2, 1, 2, 3 (0.5 is an edge: it is the third bin's).
STEP_2 = [0.0, 0.0, 0.25, 0.5, 0.5, 1.0, 1.0, 1.0]


def record(step: int, position: int, reward: float, *, drift_at: int | None = None, split: str = "train") -> dict:
    episode = Episode(
        task={"prompt": f"task {position % 4}", "data_source": "copy"},
        trajectories=[Trajectory(steps=[Step(chat_completions=[{"role": "user", "content": f"task {position % 4}"}],
                                             model_response="ok", reward=reward, done=True)], reward=reward)],
        prompt_ids=[1, 2], response_ids=[3, 4], response_mask=[1, 1],
    )
    if drift_at is not None:
        episode.info["retokenization"] = {"drift": drift_at >= 0, "position": drift_at if drift_at >= 0 else None}
    return episode_record(episode, split=split, step=step, position=position, group=f"g{step}-{position // 4}",
                          group_position=position % 4, row_index=position % 4, advantage=reward - 0.5)


@pytest.fixture
def stored_run(make_run, project, tmp_path, settings):
    """A team-visible run in ``project``: steps 1 and 3 of 8 episodes rewarded 0.5 (two checked for
    drift: position 5 drifts at token 3, position 6 does not), step 2 rewarded ``STEP_2`` with one
    more episode whose reward is not a number, and step 3's validation."""
    settings.RUNS_DIR = tmp_path
    run = make_run(project=project, visibility=Run.Visibility.TEAM, run_path=str(tmp_path / "run-folder"))
    for step in (1, 3):
        episode_store.store_step(run.pk, None, step, [
            record(step, p, 0.5, drift_at={5: 3, 6: -1}.get(p)) for p in range(8)] + [
            record(step, 0, 1.0, split="val")])
    episode_store.store_step(run.pk, None, 2, [record(2, p, r) for p, r in enumerate(STEP_2)]
                             + [record(2, 8, float("nan"))])
    return run


def get(client, url, **params) -> dict:
    response = client.get(url, params)
    assert response.status_code == 200, response.content
    return response.json()


def test_each_bin_of_a_steps_histogram_opens_exactly_its_episodes(stored_run, api_client, owner):
    client = api_client(owner)
    histogram = get(client, HISTOGRAM.format(stored_run.pk), step=2, bins=4)
    assert (histogram["step"], histogram["count"], histogram["no_reward"]) == (2, 9, 1)
    assert [(b["low"], b["high"], b["count"]) for b in histogram["bins"]] == [
        (0.0, 0.25, 2), (0.25, 0.5, 1), (0.5, 0.75, 2), (0.75, 1.0, 3)]
    for bin_ in histogram["bins"]:
        opened = get(client, URL.format(stored_run.pk), split="train", step_min=2, step_max=2,
                     reward_min=bin_["reward_min"], reward_max=bin_["reward_max"])["results"]
        assert len(opened) == bin_["count"]
        assert all(bin_["low"] <= e["reward"] <= bin_["high"] and e["step"] == 2 for e in opened)


def test_the_histogram_defaults_to_the_last_step_and_says_the_steps_stored(stored_run, api_client, owner):
    histogram = get(api_client(owner), HISTOGRAM.format(stored_run.pk))
    assert (histogram["step"], histogram["first_step"], histogram["last_step"]) == (3, 1, 3)
    # Every reward equal: one bin holding all of them.
    assert [(b["low"], b["high"], b["count"]) for b in histogram["bins"]] == [(0.5, 0.5, 8)]
    validation = get(api_client(owner), HISTOGRAM.format(stored_run.pk), split="val", step=1)
    assert [b["count"] for b in validation["bins"]] == [1]
    empty = get(api_client(owner), HISTOGRAM.format(stored_run.pk), step=7)
    assert (empty["count"], empty["bins"]) == (0, [])


def test_one_prompt_across_training_and_a_group_side_by_side(stored_run, api_client, owner):
    client = api_client(owner)
    across = get(client, URL.format(stored_run.pk), row_index=1, split="train")["results"]
    assert [(e["step"], e["position"]) for e in across] == [(1, 1), (1, 5), (2, 1), (2, 5), (3, 1), (3, 5)]
    group = get(client, URL.format(stored_run.pk), group="g2-1")["results"]
    assert [(e["group_position"], e["reward"], e["advantage"]) for e in group] == [
        (0, 0.5, 0.0), (1, 1.0, 0.5), (2, 1.0, 0.5), (3, 1.0, 0.5)]


def test_the_drift_filter_and_the_listing_say_where_it_drifts(stored_run, api_client, owner):
    client = api_client(owner)
    drifted = get(client, URL.format(stored_run.pk), drift="true")["results"]
    assert [(e["step"], e["position"], e["retokenization_drift"], e["drift_position"]) for e in drifted] == [
        (1, 5, True, 3), (3, 5, True, 3)]
    equal = get(client, URL.format(stored_run.pk), drift="false")["results"]
    assert [(e["step"], e["position"], e["drift_position"]) for e in equal] == [(1, 6, None), (3, 6, None)]
    unchecked = get(client, URL.format(stored_run.pk), step_min=2, step_max=2)["results"][0]
    assert unchecked["retokenization_drift"] is None
    detail = get(client, f"{URL.format(stored_run.pk)}{drifted[0]['id']}/")
    assert (detail["retokenization_drift"], detail["drift_position"]) == (True, 3)


@pytest.mark.parametrize(("url", "params", "field"), [
    (HISTOGRAM, {"bins": 0}, "bins"), (HISTOGRAM, {"bins": 101}, "bins"), (HISTOGRAM, {"step": -1}, "step"),
    (HISTOGRAM, {"step": 2**31}, "step"), (HISTOGRAM, {"split": "test"}, "split"), (HISTOGRAM, {"step": "x"}, "step"),
    (URL, {"row_index": -1}, "row_index"), (URL, {"row_index": 2**63}, "row_index"), (URL, {"drift": "maybe"}, "drift"),
])
def test_a_parameter_out_of_bounds_is_a_400_naming_it(stored_run, api_client, owner, url, params, field):
    response = api_client(owner).get(url.format(stored_run.pk), params)
    assert response.status_code == 400 and field in response.json(), response.content


def test_the_histogram_is_a_run_resource_a_stranger_cannot_read(stored_run, make_run, api_client, stranger, teammate, owner):
    elsewhere = Team.objects.create(name="Other team", slug="other")
    Membership.objects.create(team=elsewhere, user=stranger, role=Membership.Role.OWNER)
    Project.objects.create(team=elsewhere, name="other")
    assert api_client(stranger).get(HISTOGRAM.format(stored_run.pk)).status_code == 404
    assert api_client(stranger).get(URL.format(stored_run.pk), {"row_index": 1}).status_code == 404
    assert get(api_client(teammate), HISTOGRAM.format(stored_run.pk), step=2)["count"] == 9
    anonymous = api_client(None)
    assert anonymous.get(HISTOGRAM.format(stored_run.pk)).status_code in (401, 403)
    link = ShareLink.objects.create(run=stored_run, created_by=owner)
    assert get(anonymous, HISTOGRAM.format(stored_run.pk), step=2, share=link.token)["count"] == 9
    other = make_run()
    assert anonymous.get(HISTOGRAM.format(other.pk), {"share": link.token}).status_code == 404
    link.revoke()
    assert anonymous.get(HISTOGRAM.format(stored_run.pk), {"share": link.token}).status_code == 404
