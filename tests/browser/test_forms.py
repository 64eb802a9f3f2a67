"""The run and sweep forms in a browser: one submit shows every problem at once (a field's, a
misspelt config key's with its line, and the backend check's), the reward named as its dropdown
names it; the button says the run is being checked while it is; backends that cannot run are
greyed out with why; a clone brings its steps and batch back in their fields; a sweep's space
says each problem with its line, and a misspelt objective its nearest metric."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MUTED = "rgb(95, 107, 122)"  # platform.css --muted


@pytest.fixture
def page(live_platform, browser, owner, registry, log_in):
    page = browser.new_page()
    page.set_default_timeout(60_000)  # the first check after the server starts takes ~15 s
    log_in(page, live_platform["url"], "owner", "owner-password")
    page.base = live_platform["url"]
    yield page
    page.close()


def _errors(page, field: str) -> list[str]:
    return page.locator(f"#field-{field} .errorlist li").all_inner_texts()


def test_one_submit_shows_every_problem_at_once(page, registry):
    from webapp.runs.models import Run

    page.goto(page.base + "/runs/new/")
    page.select_option("select[name=agent]", str(registry["agents"]["frozenlake"].pk))
    page.select_option("select[name=dataset]", str(registry["datasets"]["copy"].pk))  # not FrozenLake's rows
    page.select_option("select[name=reward]", str(registry["rewards"]["char-accuracy"].pk))  # never called by an environment
    page.select_option("select[name=backend]", str(registry["backends"]["trl"].pk))
    page.select_option("select[name=model]", "tiny-char")
    page.fill("input[name=steps]", "0")
    page.fill("textarea[name=overrides]", "data.max_response_length=4\ntrainer.total_epoch=2\n")
    page.click("#run-submit")
    page.wait_for_selector("#form-error-count")

    assert "4 problems to fix" in page.inner_text("#form-error-count")
    assert "greater than or equal to 1" in " ".join(_errors(page, "steps"))
    assert _errors(page, "overrides") == ["line 2: trainer.total_epoch: unknown config key. Did you mean 'trainer.total_epochs'?"]
    assert "FrozenLakeEnv.from_dict needs 'start_row'" in " ".join(_errors(page, "dataset"))
    reward = " ".join(_errors(page, "reward"))
    assert "reward function 'char-accuracy' would never be called" in reward and "char_accuracy" not in reward
    for field in ("steps", "overrides", "dataset", "reward"):  # each visible, not only in the markup
        assert page.locator(f"#field-{field} .errorlist").is_visible()
    assert Run.objects.count() == 0


def test_a_check_that_cannot_run_says_why(page, registry):
    page.goto(page.base + "/runs/new/")
    page.select_option("select[name=agent]", str(registry["agents"]["copy-task"].pk))
    page.select_option("select[name=backend]", str(registry["backends"]["trl"].pk))
    page.select_option("select[name=model]", "tiny-char")
    page.fill("textarea[name=overrides]", "foo.bar=1\n")
    page.click("#run-submit")
    page.wait_for_selector("#form-error-count")
    assert _errors(page, "overrides") == ["line 1: foo.bar: unknown config key."]  # no far-fetched suggestion
    assert "The backend's check of the run did not run: it needs a valid dataset" in page.inner_text("#run-form > .errorlist")


def test_the_button_says_the_run_is_being_checked(page, registry):
    page.goto(page.base + "/runs/new/")
    # The state the submit puts the page in, read before the answer replaces the page.
    state = page.evaluate("""() => {
        const form = document.getElementById("run-form"), button = document.getElementById("run-submit");
        form.addEventListener("submit", ev => ev.preventDefault());  // stay on this page to look at it
        form.requestSubmit(button);
        return {busy: form.getAttribute("aria-busy"), disabled: button.disabled, text: button.textContent,
                status: document.getElementById("run-checking").textContent,
                spinner: getComputedStyle(button, "::before").animationName};
    }""")
    assert state["busy"] == "true" and state["disabled"] and state["text"] == "Checking your run…"
    assert "up to about 15 seconds" in state["status"] and state["spinner"] == "spin"
    assert page.get_by_role("status").inner_text().startswith("Checking your run with the backend")


def test_backends_that_cannot_run_are_greyed_out_with_why(page, registry):
    page.goto(page.base + "/runs/new/")
    options = page.evaluate("""() => [...document.querySelectorAll("select[name=backend] option")].filter(o => o.value).map(o =>
        ({text: o.textContent, disabled: o.disabled, color: getComputedStyle(o).color}))""")
    by_name = {option["text"].split(" ")[0]: option for option in options}
    assert not by_name["trl"]["disabled"] and "unavailable" not in by_name["trl"]["text"]
    assert by_name["verl"]["disabled"] and "(unavailable: disabled by an administrator)" in by_name["verl"]["text"]
    assert by_name["verl"]["color"] == MUTED
    assert by_name["tinker"]["disabled"] and "TINKER_API_KEY is not set" in by_name["tinker"]["text"]
    assert "Greyed out, cannot run here: " in page.inner_text("#field-backend .help")
    with pytest.raises(Exception, match="option being selected is not enabled"):  # a person cannot pick it
        page.select_option("select[name=backend]", str(registry["backends"]["verl"].pk), timeout=2_000)


def test_clone_brings_steps_and_batch_back_in_their_fields(page, make_run, registry):
    run = make_run(name="to clone", config_overrides={"trainer.total_training_steps": 7, "data.train_batch_size": 4,
                                                      "data.max_response_length": 4})
    page.goto(f"{page.base}/runs/new/?clone={run.pk}")
    assert page.input_value("input[name=steps]") == "7" and page.input_value("input[name=batch_size]") == "4"
    assert page.input_value("textarea[name=overrides]").strip() == "data.max_response_length: 4"


def test_frozenlake_defaults_show_in_their_fields(page, registry):
    page.goto(page.base + "/runs/new/")
    page.select_option("select[name=agent]", str(registry["agents"]["frozenlake"].pk))
    defaults = registry["agents"]["frozenlake"].default_config
    assert page.get_attribute("input[name=max_turns]", "placeholder") == str(defaults["rllm.agent.max_steps"])
    for name, key in (("steps", "trainer.total_training_steps"), ("batch_size", "data.train_batch_size"),
                      ("group_size", "actor_rollout_ref.rollout.n")):
        if key in defaults:  # the agent's own default, else the library's
            assert page.get_attribute(f"input[name={name}]", "placeholder") == str(defaults[key])


def test_the_sweep_form_says_each_problem_with_its_line(page, make_run):
    base = make_run(name="base", status="succeeded", final_metrics={"reward": 0.5, "val/reward": 0.4})
    page.goto(f"{page.base}/sweeps/new/?base={base.pk}")
    page.fill("textarea[name=space]", "data.train_batch_size: choice 2, many\nactor_rollout_ref.actor.optim.lr: float 1e-2..1e-4 log\n")
    page.fill("input[name=objective]", "rewad")
    page.click("#sweep-form button[type=submit]")
    page.wait_for_selector(".errorlist")
    text = page.inner_text("#sweep-form")
    assert "line 1: data.train_batch_size='many' would fail every trial" in text
    assert "line 2: actor_rollout_ref.actor.optim.lr: the range float 1e-2..1e-4 is reversed" in text
    assert "'rewad' is not a metric run" in text and "Did you mean 'reward'?" in text
