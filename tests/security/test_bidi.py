"""A business key (or any user-controlled string) with a right-to-left override cannot disguise
itself or reorder the text around it: it is shown inside ``<bdi>`` (isolated, also by the
stylesheet), and the override itself is shown as ``⟨U+202E⟩`` instead of acting.

Seen before: ``invoice-\u202egpj.exe`` displayed as ``invoice-exe.jpg`` on the runs list, the run
page, the ambiguous-effects queue and the approvals inbox.
"""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from ledger.models import EffectStatus
from sagas.models import RunStatus
from tests.console.queue_data import make_approval, make_effect, make_run

pytestmark = pytest.mark.django_db

RLO = "\u202e"
KEY = f"invoice-{RLO}gpj.exe"
SHOWN = "invoice-⟨U+202E⟩gpj.exe"
STEP = f"charge-{RLO}dlrow"


def _bdi_texts(page: str) -> list[str]:
    return re.findall(r"<bdi[^>]*>(.*?)</bdi>", page, flags=re.S)


def test_it_isolates_a_business_key_with_an_override_on_every_page(clients):
    run = make_run(status=RunStatus.NEEDS_ATTENTION, business_key=KEY, name=f"orders-{RLO}x")
    make_effect(run=run, status=EffectStatus.UNKNOWN, step=STEP, idempotency_key=f"k-{RLO}1")
    waiting = make_run(status=RunStatus.WAITING, reason="", business_key=KEY)
    make_approval(run=waiting, step=STEP, reason=f"Ship {RLO}?")
    viewer = clients["viewer"]

    pages = {
        "runs list": reverse("console:runs"),
        "run page": reverse("console:run", args=[run.id]),
        "effects queue": reverse("console:effects"),
        "approvals inbox": reverse("console:approvals"),
    }
    for name, url in pages.items():
        page = viewer.get(url).content.decode()
        isolated = _bdi_texts(page)
        assert any(SHOWN in text for text in isolated), f"{name}: the key is not inside <bdi>"
        outside = re.sub(r"<bdi[^>]*>.*?</bdi>", "", page, flags=re.S)
        assert RLO not in outside, f"{name}: an override outside <bdi>"
        for piece in page.split("<bdi")[1:]:  # an override never leaks past its <bdi>
            inside, _, _ = piece.partition("</bdi>")
            assert KEY not in inside, f"{name}: the key's override acts (shown raw)"
    effects = viewer.get(pages["effects queue"]).content.decode()
    assert any("k-⟨U+202E⟩1" in text for text in _bdi_texts(effects))  # idempotency keys too
    assert any(STEP in text for text in _bdi_texts(effects))  # step names are isolated, not rewritten


def test_it_serves_a_stylesheet_that_isolates_user_text(clients):
    page = clients["viewer"].get(reverse("console:runs")).content.decode()
    href = re.search(r'<link rel="stylesheet" href="([^"]+)"', page).group(1)
    response = clients["viewer"].get(href)
    assert response.status_code == 200
    css = b"".join(response.streaming_content).decode() if response.streaming else response.content.decode()
    assert re.search(r"bdi[^{]*\{[^}]*unicode-bidi:\s*isolate", css)
