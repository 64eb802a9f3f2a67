"""What a person sees of one stored episode, token by token: clicking it in "All episodes" opens its
page, whose tokens the model produced (trained) and the environment's (not trained) look different,
whose hover says a token's log-probability, and where each model turn begins is marked. The page
keeps the run's text as text (a reply or a token holding markup shows the markup). Tokens show the
text pieces the trainer decoded, or their ids where the record has none."""

from __future__ import annotations

import pytest

from training.tracking.episodes import episode_record
from training.types import Episode, Step, TerminationReason, Trajectory
from webapp.dashboard.episodes import store_step
from webapp.teams.models import ShareLink

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def two_turn_record(token_texts: list[str] | None = None) -> dict:
    """Two model turns (tokens 11, 12 and 31, 32) around the environment's answer (21, 22); without
    ``token_texts`` the record keeps no text pieces (shown as ids)."""
    first = [{"role": "user", "content": "add 2 and 3"}]
    second = first + [{"role": "assistant", "content": "<b>call</b> add(2, 3)"}, {"role": "tool", "content": "5"}]
    episode = Episode(
        task={"data_source": "math"},
        trajectories=[Trajectory(steps=[
            Step(chat_completions=first, model_response="<b>call</b> add(2, 3)", reward=0.0),
            Step(chat_completions=second, model_response="the answer is 5", reward=1.0, done=True),
        ], reward=1.0)],
        prompt_ids=[1, 2], response_ids=[11, 12, 21, 22, 31, 32], response_mask=[1, 1, 0, 0, 1, 1],
        response_logprobs=[-0.125, -0.5, 0.0, 0.0, -0.25, -2.0], termination_reason=TerminationReason.ENV_DONE,
    )
    record = episode_record(episode, split="train", step=1, position=0, group="g0", group_position=0, advantage=0.75)
    return {**record, "token_texts": token_texts or []}


def test_an_episode_opens_token_by_token(live_platform, browser, make_run, log_in, tail):
    run = make_run()
    store_step(run.pk, None, 1, [two_turn_record()])
    episode_id = run.stored_episodes.get().pk
    page = browser.new_page()
    page.set_default_timeout(30_000)
    try:
        log_in(page, live_platform["url"], "owner", "owner-password")
        page.goto(f"{live_platform['url']}/runs/{run.pk}/")
        page.click("#stored-episodes-list tbody tr td:nth-child(2)")  # a row, not only its link, opens it
        page.wait_for_selector("#token-view-tokens .token")
        assert page.url.endswith(f"/runs/{run.pk}/episodes/{episode_id}/")

        trained = page.query_selector_all("#token-view-tokens .token.trained")
        untrained = page.query_selector_all("#token-view-tokens .token.untrained")
        assert [t.text_content() for t in trained] == ["11", "12", "31", "32"]
        assert [t.text_content() for t in untrained] == ["21", "22"]
        colour = "el => getComputedStyle(el).backgroundColor"
        assert trained[0].evaluate(colour) != untrained[0].evaluate(colour)

        trained[3].hover()
        title = trained[3].get_attribute("title")
        assert "logprob -2.0000" in title and "advantage 0.7500" in title

        boundaries = page.query_selector_all("#token-view-tokens .turn-boundary")
        assert [b.text_content() for b in boundaries] == ["turn 1", "turn 2"]
        # The second boundary stands between the environment's tokens and the model's second turn.
        order = page.eval_on_selector_all("#token-view-tokens > *", "els => els.map(e => e.textContent)")
        assert order == ["turn 1", "11", "12", "21", "22", "turn 2", "31", "32"]

        turns = page.query_selector_all("#token-view-turns .token-view-turn")
        assert len(turns) == 2
        assert "<b>call</b> add(2, 3)" in turns[0].text_content()  # markup shown as text, not drawn
        assert page.query_selector("#token-view-turns b") is None
        assert "tool" in turns[1].text_content() and "the answer is 5" in turns[1].text_content()

        # A share link's page opens the same view without a login, carrying its token.
        link = ShareLink.objects.create(run=run, created_by=run.owner)
        browser.clear_cookies()
        page.goto(f"{live_platform['url']}/share/{link.token}/")
        page.click("#stored-episodes-list tbody tr a")
        page.wait_for_selector("#token-view-tokens .token.trained")
        assert page.url.endswith(f"/runs/{run.pk}/episodes/{episode_id}/?share={link.token}")
        assert len(page.query_selector_all("#token-view-tokens .token")) == 6
    except Exception:
        print("web log:\n" + tail(live_platform["logs"] / "web.log"))
        raise
    finally:
        page.close()


def test_tokens_show_their_text_pieces_as_text(live_platform, browser, make_run, log_in, tail):
    run = make_run()
    store_step(run.pk, None, 1, [two_turn_record(["<b>", "x", "\n", "5", " the", ""])])
    episode_id = run.stored_episodes.get().pk
    page = browser.new_page()
    page.set_default_timeout(30_000)
    try:
        log_in(page, live_platform["url"], "owner", "owner-password")
        page.goto(f"{live_platform['url']}/runs/{run.pk}/episodes/{episode_id}/")
        page.wait_for_selector("#token-view-tokens .token")
        texts = page.eval_on_selector_all("#token-view-tokens .token", "els => els.map(e => e.textContent)")
        assert texts == ["<b>", "x", "↵", "5", " the", "∅"]
        assert page.query_selector("#token-view-tokens b") is None  # a token's markup is text, not drawn
        assert page.get_attribute("#token-view-tokens .token.trained", "title").startswith("token 11 · trained")
    except Exception:
        print("web log:\n" + tail(live_platform["logs"] / "web.log"))
        raise
    finally:
        page.close()
