"""What the run page's charts draw, read from Plotly itself (the axis range it drew, the SVG it
made), not from what the socket sent: live charts follow the run until a person zooms, keep the
zoom while points arrive, follow again after a double-click; a one-point series shows a marker;
charts come in a fixed order whatever order their keys arrive in; the modebar never covers a
title. And the sweep page's charts draw every scored trial.

Steps are published to the run's group and stored as a worker's sink does, without training, so
each test knows exactly which steps the page has been sent."""

from __future__ import annotations

import pytest

from webapp.dashboard import live
from webapp.dashboard.series import SeriesWriter
from webapp.sweeps.models import Sweep, Trial

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

# What Plotly drew for the chart of ``key``: the x-axis range, and where the first trace's line
# ends, as the step at its right edge (the SVG path's extent mapped back through the axis).
DRAWN = """key => {
    const div = document.querySelector(`.dash-chart[data-key='${key}']`);
    const axis = div._fullLayout.xaxis;
    const line = div.querySelector('.scatterlayer .trace path.js-line');
    const box = line && line.getAttribute('d') ? line.getBBox() : null;
    return {range: axis.range, lineEnd: box ? axis.p2l(box.x + box.width) : null, points: Number(div.dataset.points)};
}"""


def _log(publisher: live.Publisher, writer: SeriesWriter, step: int, metrics: dict[str, float]) -> None:
    """As a worker's sink does: push the step live, then store it."""
    publisher.publish(writer.run_id, {"type": "run.metrics", "steps": [[step, metrics]]})
    publisher.flush()
    writer.write([(key, step, value) for key, value in metrics.items()])


def _open(browser, live_platform, log_in, url: str):
    page = browser.new_page()
    page.set_default_timeout(30_000)
    log_in(page, live_platform["url"], "owner", "owner-password")
    page.goto(live_platform["url"] + url)
    return page


def _drawn(page, key: str, points: int) -> dict:
    """What the chart of ``key`` shows once it has drawn ``points`` points (a frame after)."""
    page.wait_for_function(f"() => Number((document.querySelector(\".dash-chart[data-key='{key}']\") || "
                           f"{{dataset: {{}}}}).dataset.points) === {points}")
    page.evaluate("() => new Promise(resolve => requestAnimationFrame(() => resolve()))")
    return page.evaluate(DRAWN, key)


def _chart_order(page) -> list[str]:
    return page.evaluate("() => [...document.querySelectorAll('#dash-charts .dash-chart')].map(d => d.dataset.key)")


def test_live_charts_cover_the_last_step_in_a_fixed_order(live_platform, browser, make_run, log_in, tail):
    run = make_run()
    writer = SeriesWriter(run.pk)
    # The page opens at step 10 (a reload mid-run): loss and two other keys are stored already.
    writer.write([(key, step, step / 10) for step in range(1, 11) for key in ("loss", "zeta/custom", "alpha/custom")])
    publisher = live.Publisher()
    page = _open(browser, live_platform, log_in, run.get_absolute_url())
    try:
        page.wait_for_selector("#dash-live.on")
        for key in ("zeta/custom", "alpha/custom"):  # charts a person asks for, in that order
            page.fill("#dash-search", key)
            page.press("#dash-search", "Enter")
            page.wait_for_selector(f".dash-chart[data-key='{key}']")
        # Reward and KL start now (watched from their first step), KL named first in each message.
        for step in range(11, 41):
            _log(publisher, writer, step, {"kl": step / 1000, "reward": step / 100, "loss": 1 / step})
        page.wait_for_function("() => dashboardState.lastStep === 40")
        reward, loss = _drawn(page, "reward", 30), _drawn(page, "loss", 40)
        assert reward["range"][0] <= 11 and reward["range"][1] >= 40, reward
        assert loss["range"][0] <= 1 and loss["range"][1] >= 40, loss
        assert reward["lineEnd"] == pytest.approx(40, abs=0.5) and loss["lineEnd"] == pytest.approx(40, abs=0.5)
        # Reward first, then the known charts in their fixed order, then the rest by name.
        assert _chart_order(page) == ["reward", "loss", "kl", "alpha/custom", "zeta/custom"]
    except Exception:
        print("web log:\n" + tail(live_platform["logs"] / "web.log"))
        raise
    finally:
        page.close()


def _plot_point(page, key: str, step: float, height: float = 0.5) -> tuple[float, float]:
    """The page coordinates of ``step`` on the chart's x-axis, ``height`` of the way up its plot area."""
    return tuple(page.evaluate("""([key, step, height]) => {
        const div = document.querySelector(`.dash-chart[data-key='${key}']`);
        const box = div.getBoundingClientRect(), x = div._fullLayout.xaxis, y = div._fullLayout.yaxis;
        return [box.left + x._offset + x.l2p(step), box.top + y._offset + y._length * (1 - height)];
    }""", [key, step, height]))


def test_a_zoom_holds_while_points_arrive_and_a_double_click_follows_again(live_platform, browser, make_run, log_in, tail):
    run = make_run()
    writer = SeriesWriter(run.pk)
    publisher = live.Publisher()
    page = _open(browser, live_platform, log_in, run.get_absolute_url())
    try:
        page.wait_for_selector("#dash-live.on")
        for step in range(1, 21):
            _log(publisher, writer, step, {"reward": step / 100, "loss": 1 / step})
        assert _drawn(page, "reward", 20)["range"][1] >= 20
        # A person drags across steps 5 to 10 of the reward chart.
        (x0, y), (x1, _) = _plot_point(page, "reward", 5), _plot_point(page, "reward", 10)
        page.mouse.move(x0, y)
        page.mouse.down()
        page.mouse.move(x1, y, steps=8)
        page.mouse.up()
        page.wait_for_function("() => dashboardState.charts.find(c => c.id === 'reward').zoom !== null")
        zoomed = page.evaluate(DRAWN, "reward")["range"]
        assert zoomed == pytest.approx([5, 10], abs=0.3)

        for step in range(21, 31):
            _log(publisher, writer, step, {"reward": step / 100, "loss": 1 / step})
        assert _drawn(page, "loss", 30)["range"][1] >= 30  # the page has drawn the new points
        page.wait_for_timeout(500)  # and a few redraws more
        assert page.evaluate(DRAWN, "reward")["range"] == pytest.approx(zoomed)

        # A double-click goes back to the whole run, which the chart then follows again.
        page.mouse.dblclick(*_plot_point(page, "reward", 7))
        page.wait_for_function("() => dashboardState.charts.find(c => c.id === 'reward').zoom === null")
        for step in range(31, 41):
            _log(publisher, writer, step, {"reward": step / 100, "loss": 1 / step})
        drawn = _drawn(page, "reward", 40)
        assert drawn["range"][0] <= 1 and drawn["range"][1] >= 40, drawn
    except Exception:
        print("web log:\n" + tail(live_platform["logs"] / "web.log"))
        raise
    finally:
        page.close()


def test_a_one_point_series_draws_a_marker(live_platform, browser, make_run, log_in):
    """A one-step run: its reward is one point, as is the test split's score before training."""
    run = make_run(status="succeeded")
    SeriesWriter(run.pk).write([("val/copy/reward", 0, 0.25), ("reward", 1, 0.5)])
    page = _open(browser, live_platform, log_in, run.get_absolute_url())
    try:
        for key, step in (("reward", 1), ("val/", 0)):
            _drawn(page, key, 1)
            marker = page.evaluate("""key => {
                const div = document.querySelector(`.dash-chart[data-key='${key}']`);
                const point = div.querySelector('.scatterlayer .trace .points path.point');
                if (!point) return null;
                const box = point.getBoundingClientRect(), area = div.querySelector('.nsewdrag').getBoundingClientRect();
                return {width: box.width, height: box.height, centre: box.left + box.width / 2 - area.left,
                        expected: div._fullLayout.xaxis.l2p(div.data.at(-1).x[0])};
            }""", key)
            assert marker is not None, f"the {key} chart draws no point"
            assert marker["width"] > 2 and marker["height"] > 2, marker
            assert marker["centre"] == pytest.approx(marker["expected"], abs=1.5), marker  # in the plot, at its step
    finally:
        page.close()


@pytest.mark.parametrize("width", [1400, 390])
def test_the_modebar_leaves_the_titles_readable(live_platform, browser, make_run, log_in, width):
    run = make_run(status="succeeded")
    # The page's longest title, and charts of two traces (which have a legend).
    charts = {"reward": ["reward"], "val/": ["val/copy/reward", "val/other/reward"],
              "system/gpu_utilization/": ["system/gpu_utilization/0", "system/gpu_utilization/1"]}
    SeriesWriter(run.pk).write([(key, step, step / 10) for step in range(1, 6) for keys in charts.values() for key in keys])
    page = _open(browser, live_platform, log_in, run.get_absolute_url())
    try:
        page.set_viewport_size({"width": width, "height": 1000})
        for chart, keys in charts.items():
            _drawn(page, chart, 5 * len(keys))
            page.locator(f".dash-chart[data-key='{chart}']").hover()
            page.wait_for_function(f"() => getComputedStyle(document.querySelector(\".dash-chart[data-key='{chart}'] .modebar\")).opacity === '1'")
            boxes = page.evaluate("""key => {
                const div = document.querySelector(`.dash-chart[data-key='${key}']`);
                const rect = el => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
                return {title: rect(div.querySelector('.gtitle')), modebar: rect(div.querySelector('.modebar'))};
            }""", chart)
            title, modebar = boxes["title"], boxes["modebar"]
            overlap = title[0] < modebar[2] and modebar[0] < title[2] and title[1] < modebar[3] and modebar[1] < title[3]
            assert not overlap, (chart, boxes)
    finally:
        page.close()


def test_the_sweep_charts_draw_every_scored_trial(live_platform, browser, make_run, owner, log_in):
    base = make_run(name="base", status="succeeded")
    sweep = Sweep.objects.create(owner=owner, name="lr", base_run=base, space={"actor_rollout_ref.actor.optim.lr": "choice 0.01, 0.001"},
                                 sampler="grid", max_trials=3, parallel=1, status=Sweep.Status.FINISHED)
    for number, (lr, value) in enumerate(((0.01, 0.25), (0.001, 0.75), (0.0001, None))):
        Trial.objects.create(sweep=sweep, number=number, run=make_run(name=f"trial {number}", status="succeeded"),
                             params={"actor_rollout_ref.actor.optim.lr": lr}, state="complete" if value is not None else "failed",
                             value=value)
    page = _open(browser, live_platform, log_in, sweep.get_absolute_url())
    try:
        chart = ".sweep-chart[data-key='actor_rollout_ref.actor.optim.lr']"
        page.wait_for_selector(chart + " .scatterlayer .trace")
        trace = page.evaluate(f"() => {{ const t = document.querySelector(\"{chart}\").data[0]; return {{x: t.x, y: t.y}}; }}")
        assert trace == {"x": [0.01, 0.001], "y": [0.25, 0.75]}  # numbers, the unscored trial left out
        assert page.locator(chart + " .scatterlayer .trace .points path.point").count() == 2
    finally:
        page.close()
