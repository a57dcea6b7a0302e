"""Notifications in a real browser: staff add an endpoint, a real worker delivers to the demo's
receiver, and the deliveries page and the receiver's page show it. Screenshots of the endpoint
configuration, the deliveries page and the receiver's page."""

from __future__ import annotations

import re

from django.conf import settings
from playwright.sync_api import expect

from console.notifications.detect import deliveries_create_for_run
from console.notifications.models import NotificationDelivery, NotificationEndpoint
from demo.models import WebhookArrival
from ledger.models import EffectRecord, EffectStatus
from tests.console.queue_data import make_effect, make_run
from tests.procs import wait_until


def test_it_configures_an_endpoint_and_shows_its_deliveries(console, users):
    staff = users["olga"]
    staff.is_staff = True
    staff.save()
    page = console.page("olga", "/notifications/endpoints/")
    page.fill("input[name=name]", "demo receiver")
    page.fill("input[name=url]", console.providers_url + "/webhook/receive")
    page.select_option("select[name=format]", "generic")
    page.click("button.primary")
    page.wait_for_url(re.compile(r".*/notifications/endpoints/\d+/$"))
    assert page.locator("code.secret").inner_text().startswith("whsec_")
    # The demo receiver checks signatures with its own secret: give the endpoint that one.
    NotificationEndpoint.objects.filter(name="demo receiver").update(secret=settings.DEMO_WEBHOOK_SECRET)
    page.goto("/notifications/endpoints/")
    assert page.locator("#endpoint-1, table.endpoints tbody tr").count() >= 1
    assert "demo receiver" in page.locator("table.endpoints tbody").inner_text()
    console.shot(page, "notification_endpoints")

    console.worker("w1")
    run = make_run(tenant="acme", business_key="order-0012")
    make_effect(run=run, tenant="acme", step="email", connector="email.send")
    assert deliveries_create_for_run(str(run.id)) == 1
    delivery = NotificationDelivery.objects.get()
    wait_until(lambda: WebhookArrival.objects.filter(signature_ok=True).exists(), 30, what="the arrival")

    wait_until(lambda: EffectRecord.objects.filter(run_id=NotificationDelivery.objects.get().notify_run_id,
                                                   status=EffectStatus.SUCCEEDED).exists(), 20,
               what="the notify run's POST to be recorded as succeeded")
    page.goto("/notifications/")
    row = page.locator(f"#delivery-{delivery.id}")
    expect(row.locator(".badge")).to_have_text("delivered")
    expect(row).to_contain_text("order-0012")
    expect(row).to_contain_text("UNKNOWN effect")
    console.shot(page, "notification_deliveries")

    page.goto(console.providers_url + "/webhook/")
    assert "signature ok" in page.content() and "order-0012" in page.content()
    console.shot(page, "webhook_receiver")

    viewer = console.page("vic", None)
    assert viewer.goto("/notifications/endpoints/").status == 403
    assert viewer.goto("/notifications/").status == 200
