"""The episode store on the platform: a real training run keeps every episode (Parquet in the run's
artifact store, rows in the index) and its export equals what training produced; the API's access
(as every run resource), filters and bounds; a superseded attempt stores nothing."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from training.errors import ArtifactStoreError
from training.tracking import sinks as library_sinks
from training.types import TerminationReason
from webapp.dashboard import episodes as episode_store
from webapp.dashboard.models import StoredEpisode
from webapp.dashboard.recording import DashboardSink
from webapp.dashboard.series import points_after
from webapp.runs import artifacts
from webapp.runs.models import Run
from webapp.teams.models import Membership, Project, ShareLink, Team
from workers.execute import claim, train_run

from episode_records import synthetic

URL = "/api/runs/{}/episodes/"


@pytest.fixture
def stored_run(make_run, project, tmp_path, settings):
    """A team-visible run in ``project`` with 3 steps x 4 episodes stored the way the writer stores them."""
    settings.RUNS_DIR = tmp_path
    run = make_run(project=project, visibility=Run.Visibility.TEAM, run_path=str(tmp_path / "run-folder"))
    for step in (1, 2, 3):
        records = [synthetic(step, p, reward=p / 4, source="copy" if p % 2 else "math", text=f"task {step}-{p} =",
                             termination=TerminationReason.ERROR if p == 3 else TerminationReason.ENV_DONE,
                             error="ValueError: bad move" if p == 3 else "")
                   for p in range(4)]
        episode_store.store_step(run.pk, None, step, records)
    return run


def listed(client, run, **params) -> list[dict]:
    response = client.get(URL.format(run.pk), params)
    assert response.status_code == 200, response.content
    return response.json()["results"]


# -- a real run -------------------------------------------------------------------------------

# The writer stores from its own thread and connection: the rows must be committed.
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_training_run_keeps_every_episode_and_its_export_equals_what_training_produced(
        make_run, tmp_path, settings, monkeypatch, api_client, owner):
    settings.RUNS_DIR = tmp_path
    produced: list[tuple[int, list[dict]]] = []
    handed = library_sinks.MultiSink.store_episodes

    def keep_a_copy(self, step, records):  # what training hands its sinks, before any of them sees it
        produced.append((step, json.loads(json.dumps(records))))
        handed(self, step, records)

    monkeypatch.setattr(library_sinks.MultiSink, "store_episodes", keep_a_copy)
    run = make_run()
    claim(run.pk, "test-worker")
    assert train_run(run.pk) == Run.Status.SUCCEEDED
    run.refresh_from_db()

    # Validation before the first step, then 2 steps x 2 prompts x 2 episodes: every one indexed, its
    # body in the run's folder of the store.
    validation = [r for _, records in produced for r in records if r["split"] == "val"]
    produced = [(step, records) for step, records in produced if records[0]["split"] == "train"]
    assert [step for step, _ in produced] == [1, 2]
    assert StoredEpisode.objects.filter(run=run, split="train").count() == 8
    assert validation and StoredEpisode.objects.filter(run=run, split="val").count() == len(validation)
    keys = set(StoredEpisode.objects.filter(run=run).values_list("body_key", flat=True))
    assert all(artifacts.store().exists(key) and key.startswith(f"{artifacts.run_prefix(run)}/episodes/") for key in keys)
    # The stored rewards are the rewards the run's metric averaged.
    for step, value in points_after(run.pk, 0)["reward"]:
        rewards = StoredEpisode.objects.filter(run=run, split="train", step=step).values_list("reward", flat=True)
        assert sum(rewards) / len(rewards) == pytest.approx(value)

    response = api_client(owner).get(URL.format(run.pk), {"format": "parquet"})
    assert response.status_code == 200 and response["Content-Type"] == "application/vnd.apache.parquet"
    frame = pd.read_parquet(io.BytesIO(b"".join(response.streaming_content)))
    assert len(frame) == 8 + len(validation)
    frame = frame[frame["split"] == "train"]
    step, records = produced[-1]
    known = records[1]  # the second episode of the last step
    row = frame[(frame["step"] == step) & (frame["position"] == known["position"])].iloc[0]
    assert list(row["token_ids"]) == known["token_ids"] and list(row["mask"]) == known["mask"]
    assert list(row["prompt_ids"]) == known["prompt_ids"] and row["reward"] == known["reward"]
    assert row["group"] == known["group"] and row["advantage"] == pytest.approx(known["advantage"])
    assert json.loads(row["turns"])[0]["response"] == known["turns"][0]["response"]

    episode_id = int(row["id"])
    detail = api_client(owner).get(f"{URL.format(run.pk)}{episode_id}/").json()
    assert detail["token_ids"] == known["token_ids"] and detail["mask"] == known["mask"]
    assert detail["reward_components"]["score"] == known["reward"] and detail["advantage"] == pytest.approx(known["advantage"])


# -- the API ------------------------------------------------------------------------------------

def test_a_page_lists_the_fields_and_the_detail_has_the_body(stored_run, api_client, teammate):
    client = api_client(teammate)
    page = client.get(URL.format(stored_run.pk), {"limit": 5}).json()
    assert len(page["results"]) == 5 and "cursor=2%3Atrain%3A0" in page["next"]  # after step 2's first
    first = page["results"][0]
    assert {"id", "step", "group", "reward", "termination_reason", "data_source"} <= set(first)
    assert (first["step"], first["position"], first["group"]) == (1, 0, "g1-0")
    second = client.get(page["next"]).json()
    last = client.get(second["next"]).json()
    assert len(second["results"]) == 5 and len(last["results"]) == 2 and last["next"] is None
    assert [e["id"] for e in page["results"] + second["results"] + last["results"]] == list(
        StoredEpisode.objects.filter(run=stored_run).order_by("step", "position").values_list("id", flat=True))
    detail = client.get(f"{URL.format(stored_run.pk)}{first['id']}/").json()
    assert detail["token_ids"] == [4, 5, 6] and detail["mask"] == [1, 0, 1] and detail["logprobs"] == [-0.5, 0.0, -1.5]
    assert detail["prompt_ids"] == [1, 2, 3] and detail["advantage"] == -0.5
    assert detail["reward_components"] == {"score": 0.0, "format": 1.0}
    assert detail["turns"][0]["messages"] == [{"role": "user", "content": "task 1-0 ="}]
    failed = StoredEpisode.objects.get(run=stored_run, step=2, position=3)
    body = client.get(f"{URL.format(stored_run.pk)}{failed.pk}/").json()
    assert body["error"] == "ValueError: bad move" and "Traceback" in body["traceback"]


@pytest.mark.parametrize(("params", "expected"), [
    ({"step_min": 2}, [(2, p) for p in range(4)] + [(3, p) for p in range(4)]),
    ({"step_max": 1}, [(1, p) for p in range(4)]),
    ({"reward_min": 0.5, "reward_max": 0.5}, [(1, 2), (2, 2), (3, 2)]),
    ({"termination": "error"}, [(1, 3), (2, 3), (3, 3)]),
    ({"data_source": "math", "step_min": 3}, [(3, 0), (3, 2)]),
    ({"q": "TASK 2-1"}, [(2, 1)]),
    ({"group": "g3-1"}, [(3, 2), (3, 3)]),
    ({"split": "val"}, []),
])
def test_filters(stored_run, api_client, owner, params, expected):
    assert [(e["step"], e["position"]) for e in listed(api_client(owner), stored_run, **params)] == expected


@pytest.mark.parametrize(("params", "field"), [
    ({"limit": 501}, "limit"), ({"limit": 0}, "limit"), ({"offset": -1}, "offset"), ({"offset": 10**7}, "offset"),
    ({"step_min": -1}, "step_min"), ({"step_max": 2**31}, "step_max"), ({"step_min": 3, "step_max": 2}, "step_min"),
    ({"reward_min": "nan"}, "reward_min"), ({"reward_max": "1e999"}, "reward_max"), ({"reward_min": "x"}, "reward_min"),
    ({"termination": "exploded"}, "termination"), ({"q": "x" * 201}, "q"), ({"group": "g" * 65}, "group"),
    ({"data_source": "d" * 201}, "data_source"), ({"format": "csv"}, "format"), ({"split": "test"}, "split"),
])
def test_a_filter_out_of_bounds_is_a_400_naming_it(stored_run, api_client, owner, params, field):
    response = api_client(owner).get(URL.format(stored_run.pk), params)
    assert response.status_code == 400 and field in response.json(), response.content


def test_jsonl_streams_the_whole_filtered_set(stored_run, api_client, owner):
    response = api_client(owner).get(URL.format(stored_run.pk), {"format": "jsonl", "termination": "error"})
    assert response.status_code == 200 and response["Content-Type"] == "application/jsonl"
    lines = [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]
    assert [(e["step"], e["position"], e["token_ids"], e["mask"]) for e in lines] == [
        (step, 3, [4, 5, 6], [1, 0, 1]) for step in (1, 2, 3)]


def test_the_parquet_export_of_an_empty_set_is_a_readable_empty_table(stored_run, api_client, owner):
    response = api_client(owner).get(URL.format(stored_run.pk), {"format": "parquet", "step_min": 99})
    frame = pd.read_parquet(io.BytesIO(b"".join(response.streaming_content)))
    assert len(frame) == 0 and {"token_ids", "mask", "reward", "id"} <= set(frame.columns)


# -- access -------------------------------------------------------------------------------------

def test_a_member_of_another_project_and_a_stranger_get_404(stored_run, api_client, stranger):
    elsewhere = Team.objects.create(name="Other team", slug="other")
    Membership.objects.create(team=elsewhere, user=stranger, role=Membership.Role.OWNER)
    Project.objects.create(team=elsewhere, name="other")
    episode = StoredEpisode.objects.filter(run=stored_run).first()
    client = api_client(stranger)
    assert client.get(URL.format(stored_run.pk)).status_code == 404
    assert client.get(f"{URL.format(stored_run.pk)}{episode.pk}/").status_code == 404
    assert client.get(URL.format(stored_run.pk), {"format": "jsonl"}).status_code == 404


def test_an_episode_of_another_run_is_a_404_under_this_one(stored_run, make_run, api_client, owner):
    other = make_run()
    episode = StoredEpisode.objects.filter(run=stored_run).first()
    assert api_client(owner).get(f"{URL.format(other.pk)}{episode.pk}/").status_code == 404


def test_a_share_link_reads_the_episodes_and_nothing_else(stored_run, make_run, api_client, owner):
    link = ShareLink.objects.create(run=stored_run, created_by=owner)
    anonymous = api_client(None)
    assert anonymous.get(URL.format(stored_run.pk)).status_code in (401, 403)
    page = anonymous.get(URL.format(stored_run.pk), {"share": link.token})
    assert page.status_code == 200 and len(page.json()["results"]) == 12
    episode = page.json()["results"][0]["id"]
    assert anonymous.get(f"{URL.format(stored_run.pk)}{episode}/", {"share": link.token}).json()["token_ids"] == [4, 5, 6]
    assert anonymous.post(f"{URL.format(stored_run.pk)}?share={link.token}").status_code in (401, 403, 405)
    assert anonymous.delete(f"/api/runs/{stored_run.pk}/?share={link.token}").status_code in (401, 403)
    other = make_run()
    assert anonymous.get(URL.format(other.pk), {"share": link.token}).status_code == 404
    link.revoke()
    assert anonymous.get(URL.format(stored_run.pk), {"share": link.token}).status_code == 404


# -- the writer ---------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_a_superseded_attempt_writes_no_episodes(make_run, tmp_path, settings):
    settings.RUNS_DIR = tmp_path
    run = make_run(run_path=str(tmp_path / "run-folder"))
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, attempts=2)  # attempt 2 took the run over
    stale = DashboardSink(run.pk, flush_seconds=3600, publish=False, spool_dir=tmp_path / "run-folder", attempt=1)
    stale.store_episodes(1, [synthetic(1, p, 1.0) for p in range(4)])
    stale.close()
    assert stale.superseded
    assert not StoredEpisode.objects.filter(run=run).exists()
    assert artifacts.store().list(episode_store.episodes_prefix(run)) == []

    current = DashboardSink(run.pk, flush_seconds=3600, publish=False, spool_dir=tmp_path / "run-folder", attempt=2)
    current.store_episodes(1, [synthetic(1, p, 1.0) for p in range(4)])
    current.close()
    assert StoredEpisode.objects.filter(run=run, attempt=2).count() == 4


@pytest.mark.django_db(transaction=True)
def test_a_step_written_again_replaces_its_episodes_and_past_the_buffer_steps_are_dropped_and_counted(make_run, tmp_path, settings):
    settings.RUNS_DIR = tmp_path
    settings.RUN_BUFFER_MAX_EPISODES = 6
    run = make_run(run_path=str(tmp_path / "run-folder"))
    sink = DashboardSink(run.pk, flush_seconds=3600, publish=False)
    sink.store_episodes(1, [synthetic(1, p, 0.0) for p in range(4)])
    sink.store_episodes(2, [synthetic(2, p, 0.0) for p in range(4)])  # 8 > 6 waiting: dropped whole
    sink.episode_writer.flush()
    sink.store_episodes(1, [synthetic(1, p, 1.0) for p in range(4)])  # a resumed attempt replays step 1
    sink.close()
    assert list(StoredEpisode.objects.filter(run=run).values_list("step", "reward")) == [(1, 1.0)] * 4
    assert points_after(run.pk, -1)["overload/dropped_episodes"][-1][1] == 4
    detail = episode_store.detail(StoredEpisode.objects.filter(run=run).first())
    assert detail["reward"] == 1.0 and detail["token_ids"] == [4, 5, 6]


def test_the_run_page_and_a_share_link_page_offer_the_filtered_list(stored_run, owner, page_client):
    page = page_client(owner).get(f"/runs/{stored_run.pk}/").content.decode()
    assert f'data-url="/api/runs/{stored_run.pk}/episodes/"' in page and "stored_episodes.js" in page
    link = ShareLink.objects.create(run=stored_run, created_by=owner)
    shared = page_client(None).get(f"/share/{link.token}/").content.decode()
    assert f'data-url="/api/runs/{stored_run.pk}/episodes/?share={link.token}"' in shared


@pytest.mark.django_db(transaction=True)
def test_episodes_a_killed_process_spooled_are_stored_by_the_next_attempt(make_run, tmp_path, settings):
    settings.RUNS_DIR = tmp_path
    folder = tmp_path / "run-folder"
    run = make_run(run_path=str(folder))
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, attempts=1)
    killed = DashboardSink(run.pk, flush_seconds=3600, publish=False, spool_dir=folder, attempt=1)
    killed.store_episodes(1, [synthetic(1, p, 0.25) for p in range(4)])  # spooled, never written: the process dies
    assert not StoredEpisode.objects.filter(run=run).exists()
    Run.objects.filter(pk=run.pk).update(attempts=2)  # re-queued, resumed in the same folder
    resumed = DashboardSink(run.pk, flush_seconds=3600, publish=False, spool_dir=folder, attempt=2)
    resumed.store_episodes(2, [synthetic(2, p, 0.5) for p in range(4)])
    resumed.close()
    assert list(StoredEpisode.objects.filter(run=run).values_list("step", "reward", "attempt")) == (
        [(1, 0.25, 2)] * 4 + [(2, 0.5, 2)] * 4)
    assert episode_store.detail(StoredEpisode.objects.get(run=run, step=1, position=2))["mask"] == [1, 0, 1]


@pytest.mark.django_db(transaction=True)
def test_steps_the_artifact_store_refuses_wait_in_the_spool_and_are_stored_once_when_it_answers(
        make_run, tmp_path, settings, monkeypatch):
    settings.RUNS_DIR = tmp_path
    folder = tmp_path / "run-folder"
    run = make_run(run_path=str(folder))
    store = artifacts.store()
    put = type(store).put_bytes
    down = {"yes": True}

    def flaky_put(self, data, key, *args, **kwargs):  # the store away, as S3 refusing connections
        if down["yes"]:
            raise ConnectionError("the artifact store is unreachable")
        return put(self, data, key, *args, **kwargs)

    monkeypatch.setattr(type(store), "put_bytes", flaky_put)
    sink = DashboardSink(run.pk, flush_seconds=3600, publish=False, spool_dir=folder)
    for step in (1, 2, 3):
        sink.store_episodes(step, [synthetic(step, p, step / 4) for p in range(4)])
        sink.log_metrics(step, {"reward": step / 4})
        with pytest.raises(ConnectionError):
            sink.episode_writer.flush()
        sink.flush()  # the metrics are not held back
    assert points_after(run.pk, -1)["reward"][-1] == [3, 0.75]
    assert not StoredEpisode.objects.filter(run=run).exists()
    assert len(list((folder / "spool").glob("episodes-*.jsonl"))) == 3  # waiting on disk, not dropped
    down["yes"] = False
    sink.store_episodes(4, [synthetic(4, p, 1.0) for p in range(4)])
    sink.close()

    stored = list(StoredEpisode.objects.filter(run=run).values_list("step", "position", "reward"))
    assert stored == [(s, p, s / 4) for s in (1, 2, 3, 4) for p in range(4)]
    assert sink.dropped_episodes == 0 and "overload/dropped_episodes" not in points_after(run.pk, -1)
    assert list((folder / "spool").glob("episodes-*.jsonl")) == []
    assert episode_store.detail(StoredEpisode.objects.get(run=run, step=2, position=1))["token_ids"] == [4, 5, 6]


class SteppingClock:
    """``time.monotonic`` for the export: one second passes at each look (the export's time limit is
    reached after a known number of chunks, whatever the machine's speed)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_an_export_past_its_time_limit_ends_with_a_note_and_goes_on_from_it(stored_run, api_client, owner, settings,
                                                                             monkeypatch, fmt):
    import pyarrow.parquet as pq

    monkeypatch.setattr(episode_store, "EXPORT_CHUNK", 4)
    monkeypatch.setattr(episode_store.time, "monotonic", SteppingClock())
    settings.EPISODE_EXPORT_MAX_SECONDS = 2  # one chunk of 4 of the run's 12 episodes, then the limit
    client = api_client(owner)
    response = client.get(URL.format(stored_run.pk), {"format": fmt})
    assert response.status_code == 200 and response["X-Export-Time-Limit"] == "2"
    body = b"".join(response.streaming_content)
    if fmt == "jsonl":
        lines = [json.loads(line) for line in body.splitlines()]
        note = lines.pop()["export_cut"]
        ids = [line["id"] for line in lines]
    else:
        table = pq.read_table(io.BytesIO(body))
        note = json.loads(pq.ParquetFile(io.BytesIO(body)).metadata.metadata[b"export_cut"])  # the file's key-value metadata
        ids = table.column("id").to_pylist()
    every = list(StoredEpisode.objects.filter(run=stored_run).order_by("id").values_list("id", flat=True))
    assert ids == every[:4] and note["episodes"] == 4 and note["last_id"] == every[3]
    assert "cut after" in note["message"] and f"after_id={every[3]}" in note["message"]

    settings.EPISODE_EXPORT_MAX_SECONDS = 3600
    rest = b"".join(client.get(URL.format(stored_run.pk), {"format": fmt, "after_id": note["last_id"]}).streaming_content)
    if fmt == "jsonl":
        following = [json.loads(line) for line in rest.splitlines()]
        assert [line["id"] for line in following] == every[4:] and "export_cut" not in following[-1]
    else:
        assert pq.read_table(io.BytesIO(rest)).column("id").to_pylist() == every[4:]
        assert b"export_cut" not in pq.ParquetFile(io.BytesIO(rest)).metadata.metadata


def test_after_id_out_of_bounds_is_a_400(stored_run, api_client, owner):
    response = api_client(owner).get(URL.format(stored_run.pk), {"format": "jsonl", "after_id": -1})
    assert response.status_code == 400 and "after_id" in response.json()


@pytest.mark.django_db(transaction=True)
def test_a_body_whose_file_is_gone_says_so_and_a_store_that_does_not_answer_is_a_503(stored_run, api_client, owner, monkeypatch):
    client = api_client(owner)
    row = StoredEpisode.objects.filter(run=stored_run, step=2).order_by("position").first()
    url = f"{URL.format(stored_run.pk)}{row.pk}/"
    assert client.get(url).json()["body_missing"] is False

    store = artifacts.store()

    def away(key):
        raise ArtifactStoreError(f"reading {key}: ConnectionError: secret-host:9000 refused")

    monkeypatch.setattr(type(store), "open", lambda self, key: away(key))
    answer = client.get(url)
    assert answer.status_code == 503 and "artifact store did not answer" in answer.json()["detail"]
    assert "secret-host" not in answer.content.decode()  # the store's own words stay in the log
    monkeypatch.undo()

    store.delete(row.body_key)
    detail = client.get(url)
    assert detail.status_code == 200, detail.content
    body = detail.json()
    assert body["body_missing"] is True and body["token_ids"] == [] and body["step"] == 2
