"""The token view's page of one stored episode (``/runs/<id>/episodes/<episode id>/``): access exactly
as the run page's (the owner and a teammate, a share link's token without a login; a stranger, a
revoked link, another run's link or episode are a 404), and the address of the API it draws from."""

from __future__ import annotations

import pytest

from training.tracking.episodes import episode_record
from training.types import Episode, Step, Trajectory
from webapp.dashboard import episodes as episode_store
from webapp.dashboard.models import StoredEpisode
from webapp.runs.models import Run
from webapp.teams.models import ShareLink


@pytest.fixture
def stored(make_run, project, tmp_path, settings) -> tuple[Run, StoredEpisode]:
    """A team-visible run with one stored episode, and that episode's row."""
    settings.RUNS_DIR = tmp_path
    run = make_run(project=project, visibility=Run.Visibility.TEAM, run_path=str(tmp_path / "run-folder"))
    episode = Episode(trajectories=[Trajectory(steps=[Step(chat_completions=[{"role": "user", "content": "hi"}],
                                                           model_response="ok", reward=1.0, done=True)], reward=1.0)],
                      prompt_ids=[1], response_ids=[2, 3], response_mask=[1, 0], response_logprobs=[-0.5, 0.0])
    episode_store.store_step(run.pk, None, 1, [episode_record(episode, split="train", step=1, position=0, group="g",
                                                              group_position=0)])
    return run, StoredEpisode.objects.get(run=run)


def address(run: Run, episode: StoredEpisode) -> str:
    return f"/runs/{run.pk}/episodes/{episode.pk}/"


def test_the_owner_and_a_teammate_open_it_and_a_stranger_gets_404(stored, owner, teammate, stranger, page_client):
    run, episode = stored
    for user in (owner, teammate):
        page = page_client(user).get(address(run, episode))
        assert page.status_code == 200
        html = page.content.decode()
        assert f'data-url="/api/runs/{run.pk}/episodes/{episode.pk}/"' in html and "token_view.js" in html
    assert page_client(stranger).get(address(run, episode)).status_code == 404


def test_without_a_login_or_a_link_it_asks_to_log_in(stored, page_client):
    response = page_client(None).get(address(*stored))
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_a_share_link_opens_it_until_revoked_and_only_for_its_run(stored, make_run, owner, page_client):
    run, episode = stored
    link = ShareLink.objects.create(run=run, created_by=owner)
    anonymous = page_client(None)
    page = anonymous.get(address(run, episode), {"share": link.token})
    assert page.status_code == 200
    assert f'data-url="/api/runs/{run.pk}/episodes/{episode.pk}/?share={link.token}"' in page.content.decode()
    assert f'href="/share/{link.token}/' in page.content.decode()  # back to the shared page, not the owner's
    other = make_run()
    assert anonymous.get(f"/runs/{other.pk}/episodes/{episode.pk}/", {"share": link.token}).status_code == 404
    link.revoke()
    assert anonymous.get(address(run, episode), {"share": link.token}).status_code == 404


def test_an_episode_of_another_run_is_a_404_under_this_one(stored, make_run, page_client, owner):
    _, episode = stored
    other = make_run()
    assert page_client(owner).get(f"/runs/{other.pk}/episodes/{episode.pk}/").status_code == 404


def test_the_run_page_links_each_episode_to_its_page(stored, owner, page_client):
    run, _ = stored
    html = page_client(owner).get(f"/runs/{run.pk}/").content.decode()
    assert f'data-page-url="/runs/{run.pk}/episodes/"' in html
