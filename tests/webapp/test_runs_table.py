"""The runs table: columns of a metric's latest or best value and of a config key, chosen by the
person and kept on the server; sorting by the database (the right page of many); grouping by tag
or config value; and only what the reader may see, in rows and in the keys offered."""

from __future__ import annotations

import re

import pytest

from webapp.dashboard.series import SeriesWriter
from webapp.runs.models import Run, RunTableView
from webapp.dashboard.pages import PAGE_SIZE

pytestmark = pytest.mark.django_db


def _order(page: str) -> list[int]:
    """The run ids of the table's rows, top to bottom."""
    return [int(pk) for pk in re.findall(r'<tr data-run="(\d+)">', page)]


def _add(client, **fields):
    return client.post("/runs/table/", fields, follow=True)


def _offered(page: str, select_id: str) -> list[str]:
    options = re.search(rf'<select name="\w+" id="{select_id}">(.*?)</select>', page, re.S).group(1)
    return re.findall(r'<option value="([^"]*)"', options)


def _cells(page: str, run_id: int) -> list[str]:
    row = re.search(rf'<tr data-run="{run_id}">(.*?)</tr>', page, re.S).group(1)
    return re.findall(r'<td class="number">(.*?)</td>', row)


@pytest.fixture
def three(make_run):
    """Runs whose reward peaked at different steps (so the latest and the best order them apart),
    with a learning rate each."""
    runs = {}
    for name, rewards, lr in (("peaked", [0.1, 0.9, 0.2], 0.01), ("steady", [0.3, 0.4, 0.5], 0.001), ("low", [0.0, 0.1, 0.6], 0.1)):
        run = make_run(name=name, config_overrides={"actor_rollout_ref.actor.optim.lr": lr}, tags=[name[0], "all"])
        SeriesWriter(run.pk).write(("reward", step, value) for step, value in enumerate(rewards, start=1))
        runs[name] = Run.objects.get(pk=run.pk)
    return runs


def test_the_store_keeps_each_keys_range_on_the_run_and_a_fold_makes_it_exact(make_run):
    run = make_run()
    writer = SeriesWriter(run.pk)
    writer.write([("reward", 1, 0.5), ("reward", 2, 0.9), ("loss", 1, float("nan")), ("loss", 2, 3.0)])
    writer.write([("reward", 3, -0.2)])
    assert Run.objects.get(pk=run.pk).value_ranges == {"reward": {"min": -0.2, "max": 0.9}, "loss": {"min": 3.0, "max": 3.0}}
    writer.write([("reward", 2, 0.4)])  # a resumed attempt replays step 2 with another value
    writer.fold()
    assert Run.objects.get(pk=run.pk).value_ranges["reward"] == {"min": -0.2, "max": 0.5}


def test_metric_and_config_columns_show_each_runs_values(owner_client, three):
    _add(owner_client, add="metric", metric="reward", aggregate="max")
    _add(owner_client, add="metric", metric="reward", aggregate="latest")
    page = _add(owner_client, add="config", config="actor_rollout_ref.actor.optim.lr").content.decode()
    assert RunTableView.objects.get(user__username="owner").columns == [
        "metric:reward:max", "metric:reward:latest", "config:actor_rollout_ref.actor.optim.lr"]
    assert _cells(page, three["peaked"].pk) == ["0.9", "0.2", "0.01"]
    assert _cells(page, three["steady"].pk) == ["0.5", "0.5", "0.001"]
    assert "reward (highest)" in page and "reward (latest)" in page


def test_sorting_by_a_column_is_the_databases_and_is_remembered(owner_client, three):
    ids = {name: run.pk for name, run in three.items()}
    by_best = _order(owner_client.get("/?sort=-metric:reward:max").content.decode())
    assert by_best == [ids["peaked"], ids["low"], ids["steady"]]
    by_latest = _order(owner_client.get("/?sort=-metric:reward:latest").content.decode())
    assert by_latest == [ids["low"], ids["steady"], ids["peaked"]]
    by_lr = _order(owner_client.get("/?sort=config:actor_rollout_ref.actor.optim.lr").content.decode())
    assert by_lr == [ids["steady"], ids["peaked"], ids["low"]]
    assert _order(owner_client.get("/").content.decode()) == by_lr  # kept for the next visit
    assert RunTableView.objects.get(user__username="owner").sort == "config:actor_rollout_ref.actor.optim.lr"


def test_sorting_pages_through_every_run_in_order(owner_client, make_run):
    """The sort is the query's: page 2 holds the next runs by value, not a sorted part of the newest."""
    template = make_run(name="bulk")
    fields = {f.attname: getattr(template, f.attname) for f in Run._meta.concrete_fields if f.attname not in ("id", "uid")}
    values = [(i * 37) % 151 / 10 for i in range(PAGE_SIZE + 30)]
    Run.objects.bulk_create([Run(**{**fields, "name": f"bulk-{i}", "latest_values": {"reward": value}})
                             for i, value in enumerate(values)])
    reward = dict(Run.objects.filter(name__startswith="bulk-").values_list("pk", "latest_values__reward"))
    first = _order(owner_client.get("/?sort=-metric:reward:latest").content.decode())
    second = _order(owner_client.get("/?page=2").content.decode())
    assert len(first) == PAGE_SIZE and len(second) == 31  # the template run without a reward comes last
    shown = [reward[pk] for pk in first + second[:-1]]
    assert shown == sorted(values, reverse=True) and second[-1] == template.pk


def test_grouping_by_tag_puts_a_run_under_each_of_its_tags_with_counts_and_means(owner_client, three, make_run):
    make_run(name="untagged")
    _add(owner_client, add="metric", metric="reward", aggregate="max")
    page = owner_client.get("/?group=tag").content.decode()
    heads = re.findall(r'<tr class="group-head" data-group="([^"]+)"><th[^>]*>([^<]*)</th>\s*<td>([^<]*)</td>', page)
    assert [(group, text.strip(), mean) for group, text, mean in heads] == [
        ("all", "tag: all · 3 runs", "mean 0.6667"), ("l", "tag: l · 1 run", "mean 0.6"), ("p", "tag: p · 1 run", "mean 0.9"),
        ("s", "tag: s · 1 run", "mean 0.5"), ("(none)", "tag: (none) · 1 run", "")]
    assert len(_order(page)) == 7  # each tagged run twice
    assert RunTableView.objects.get(user__username="owner").group == "tag"
    assert 'data-group="all"' in owner_client.get("/").content.decode()  # remembered
    assert 'data-group' not in owner_client.get("/?group=").content.decode()


def test_grouping_by_a_config_value(owner_client, make_run):
    for name, batch in (("a", 4), ("b", 2), ("c", 4)):
        make_run(name=name, config_overrides={"data.train_batch_size": batch})
    page = owner_client.get("/?group=config:data.train_batch_size").content.decode()
    assert re.findall(r'data-group="([^"]+)"', page) == ["2", "4"]
    assert "config:data.train_batch_size: 4 · 2 runs" in page


def test_a_bad_sort_or_grouping_is_named_and_the_saved_one_kept(owner_client, three):
    owner_client.get("/?sort=-steps")
    page = owner_client.get("/?sort=colour&group=mood").content.decode()
    assert "Cannot sort by &#x27;colour&#x27;" in page and "Cannot group by &#x27;mood&#x27;" in page
    view = RunTableView.objects.get(user__username="owner")
    assert view.sort == "-steps" and view.group == ""
    page = _add(owner_client, add="metric", metric="reward", aggregate="median").content.decode()
    assert "A metric column is metric:&lt;key&gt;:latest, :max or :min" in page
    assert RunTableView.objects.get(user__username="owner").columns == []


def test_a_column_taken_away(owner_client, three):
    _add(owner_client, add="metric", metric="reward", aggregate="min")
    page = _add(owner_client, remove="metric:reward:min").content.decode()
    assert RunTableView.objects.get(user__username="owner").columns == [] and "reward (lowest)" not in page


def test_strangers_runs_and_keys_never_show(owner_client, three, make_run, stranger):
    """A stranger's run with a metric and a config key of its own: not in the rows (sorted, grouped),
    its keys not offered, and a column of its key refused as if it did not exist."""
    theirs = make_run(name="secret run", owner=stranger, tags=["all"], config_overrides={"secret.knob": 1})
    SeriesWriter(theirs.pk).write([("secret_metric", 1, 99.0), ("reward", 1, 5.0)])
    for query in ("/", "/?sort=-metric:reward:max", "/?group=tag", "/?group=config:secret.knob", "/?sort=config:secret.knob"):
        page = owner_client.get(query).content.decode()
        assert theirs.pk not in _order(page) and "secret run" not in page, query
        assert _offered(page, "column-metric") == ["reward"], query
        assert "secret.knob" not in _offered(page, "column-config") and "config:secret.knob" not in _offered(page, "run-group")
    page = _add(owner_client, add="metric", metric="secret_metric", aggregate="latest").content.decode()
    assert "No run you can see has the metric key &#x27;secret_metric&#x27;" in page
    page = _add(owner_client, add="config", config="secret.knob").content.decode()
    assert "No run you can see has the config key &#x27;secret.knob&#x27;" in page
    assert RunTableView.objects.get(user__username="owner").columns == []
    assert "mean 5" not in owner_client.get("/?group=tag").content.decode()  # nor counted in a group's mean


def test_a_teammate_sees_the_team_runs_keys(page_client, make_run, project, teammate):
    shared = make_run(name="team run", project=project, visibility=Run.Visibility.TEAM)
    SeriesWriter(shared.pk).write([("team_metric", 1, 1.0)])
    page = page_client(teammate).get("/").content.decode()
    assert '<option value="team_metric">' in page
    _add(page_client(teammate), add="metric", metric="team_metric", aggregate="latest")
    assert RunTableView.objects.get(user=teammate).columns == ["metric:team_metric:latest"]


def test_the_migration_fills_the_ranges_of_runs_stored_before_it(make_run):
    import importlib

    from django.apps import apps

    run = make_run()
    writer = SeriesWriter(run.pk)
    writer.write([("reward", step, step / 10) for step in range(1, 20000)])  # folded: summaries
    writer.write([("reward", 20000, 9999.0), ("loss", 1, -1.0)])  # in the tail
    Run.objects.filter(pk=run.pk).update(value_ranges={})
    importlib.import_module("webapp.dashboard.migrations.0006_run_value_ranges").forward(apps, None)
    assert Run.objects.get(pk=run.pk).value_ranges == {"reward": {"min": 0.1, "max": 9999.0}, "loss": {"min": -1.0, "max": -1.0}}
