"""``make demo`` as a user runs it: an UNKNOWN effect is notified to the demo's webhook receiver
within seconds, signed, once, and the receiver's page shows it."""

from __future__ import annotations

import re
import urllib.request

import pytest

from demo.models import WebhookArrival
from ledger.models import EffectRecord, EffectStatus
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_notifies_the_demo_receiver_within_seconds_of_an_unknown_effect(demo):
    proc = demo.start("--port", "0", "--kill-every", "0", "--duration", "120")
    found = wait_until(lambda: re.search(r"arrive at (http://\S+/webhook/)", demo.output()) or proc.poll() is not None,
                       90, what="the demo to print the receiver's page")
    assert proc.poll() is None, demo.output()

    def notified():
        for effect in EffectRecord.objects.filter(status=EffectStatus.UNKNOWN, connector="email.send"):
            arrival = WebhookArrival.objects.filter(kind="unknown_effect", body__item=f"effect:{effect.id}").first()
            if arrival is not None:
                return effect, arrival
        return None

    effect, arrival = wait_until(notified, 90, interval=0.5, what="an UNKNOWN effect notified to the receiver")
    delay = (arrival.received_at - effect.updated_at).total_seconds()
    print(f"UNKNOWN effect {effect.id} ({effect.connector}) recorded -> arrived at the demo receiver: {delay:.2f} s")
    assert arrival.signature_ok
    assert delay < 5
    assert WebhookArrival.objects.filter(body__item=f"effect:{effect.id}").count() == 1
    page = urllib.request.urlopen(found.group(1), timeout=10).read().decode()
    assert "signature ok" in page and "UNKNOWN effect" in page
    demo.kill_everything()
