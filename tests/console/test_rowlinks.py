"""The queues' per-row URLs and action targets, computed once per row in Python
(``console.rowlinks``), are exactly what the template tags made: the same URLs, and the same
escaped markup of ``console/action_target.html`` for hostile keys and steps."""

from __future__ import annotations

import uuid

import pytest
from django.template.loader import render_to_string
from django.urls import reverse

from console.rowlinks import action_target, url_maker

HOSTILE = '<script>alert("x")</script>\u202eevil & more ' + "k" * 80


@pytest.mark.parametrize("fields", [
    {"run_id": uuid.uuid4(), "key": HOSTILE, "step": "<b>ship</b>", "effect_id": 42},
    {"run_id": uuid.uuid4(), "key": "", "step": "charge"},
    {"run_id": uuid.uuid4(), "key": "order-1", "step": ""},
])
def test_the_action_target_is_the_template_s_markup_escaped_the_same(fields):
    by_template = render_to_string("console/action_target.html", fields)
    assert str(action_target(**fields)) == by_template
    assert "<script>" not in by_template and "<b>" not in by_template


def test_a_row_url_is_the_reversed_one():
    run_id = uuid.uuid4()
    assert url_maker("console:run_item_payload", run=True, kind="effect-request")(run_id=run_id, item_id=7) \
        == reverse("console:run_item_payload", args=[run_id, "effect-request", 7])
    assert url_maker("console:effect_resolve")(item_id=123456) == reverse("console:effect_resolve", args=[123456])
    assert url_maker("console:approval_decide")(item_id=9) == reverse("console:approval_decide", args=[9])
