"""What a person setting up an email alert sees on a platform whose mail goes to the console (the
embedded default, as `make run` runs it): the form, the added rule and its delivery say that the
mail is printed there, not sent."""

from __future__ import annotations

import time

import pytest

from webapp.integrations.alerts import EMAIL_PRINTED_NOTE, deliver_due
from webapp.integrations.models import AlertDelivery

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_email_alert_says_it_is_printed_to_the_console(live_platform, browser, owner, make_run, log_in, tail):
    page = browser.new_page()
    page.set_default_timeout(30_000)
    try:
        log_in(page, live_platform["url"], "owner", "owner-password")
        page.goto(live_platform["url"] + "/alerts/")
        assert page.inner_text("#email-printed-note") == EMAIL_PRINTED_NOTE  # before anything is set up
        page.fill("input[name=target]", "owner@example.org")
        page.check("input[name=events][value=succeeded]")
        page.click("#rule-form button[type=submit]")
        page.wait_for_selector(".messages")
        assert EMAIL_PRINTED_NOTE in page.inner_text(".messages")
        assert page.inner_text("tr.alert-rule .email-printed") == "(printed to the console, not sent)"

        run = make_run(name="alerted")
        assert run.claim("test-worker") and run.finish("succeeded", steps=2)
        # The finish asked the platform's worker to send it; it may have, or this sends it.
        deliver_due()
        delivery = AlertDelivery.objects.get(run=run)
        deadline = time.monotonic() + 30
        while delivery.status != AlertDelivery.Status.SENT and time.monotonic() < deadline:
            time.sleep(0.2)
            delivery.refresh_from_db()
        assert delivery.status == AlertDelivery.Status.SENT and delivery.attempts == 1
        page.reload()
        assert page.inner_text("tr.delivery .status") == "printed to the console, not sent"
    except Exception:
        print("web log:\n" + tail(live_platform["logs"] / "web.log"))
        raise
    finally:
        page.close()
