"""The shortcuts the list pages render their rows with write exactly what Django's own tags and
filters wrote before them: the moments (``|stamp``, ``|iso_time`` against ``|date``), the row
forms' hidden inputs (``{% form_state %}`` against ``{% csrf_token %}`` and two inputs), and the
previews (escaped: hostile text stays text)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from django.middleware.csrf import get_token
from django.template import Context, Template
from django.test import RequestFactory

from console.templatetags.ages import iso_time, stamp
from console.templatetags.payloads import PREVIEW_CHARS, long_text, payload

HOSTILE = "<script>alert(1)</script>&\"'"


def render(source: str, **context) -> str:
    return Template(source).render(Context(context))


def test_moments_read_as_djangos_date_filter_wrote_them():
    for moment in (datetime(2026, 12, 5, 13, 20, 7, 123456, tzinfo=UTC),
                   datetime(2026, 3, 29, 1, 59, 59, tzinfo=timezone(timedelta(hours=-7))),
                   datetime(2025, 1, 1, 0, 0, 0, tzinfo=timezone(timedelta(hours=5, minutes=30)))):
        assert stamp(moment) == render('{{ m|date:"Y-m-d H:i:s" }}', m=moment)
        assert iso_time(moment) == render("{{ m|date:'c' }}", m=moment)
    assert stamp(None) == "" == iso_time(None) == render('{{ m|date:"Y-m-d H:i:s" }}', m=None)


def test_the_row_forms_state_is_the_csrf_input_and_the_pages_position():
    request = RequestFactory().get("/")
    token = get_token(request)
    ours = Template('{% load rowforms %}{% form_state after=a filters=f as s %}{{ s }}').render(
        Context({"csrf_token": token, "a": '1_2"><b>', "f": "q=<i>"}))
    theirs = Template('{% csrf_token %}\n<input type="hidden" name="after" value="{{ a }}">\n'
                      '<input type="hidden" name="filters" value="{{ f }}">').render(
        Context({"csrf_token": token, "a": '1_2"><b>', "f": "q=<i>"}))
    assert ours == theirs
    # A live push renders without a request: no token, as {% if csrf_token %} left it out.
    assert Template("{% load rowforms %}{% form_state as s %}[{{ s }}]").render(Context({})) == "[]"


def test_previews_escape_what_they_show_and_say_how_much_is_cut():
    short = payload({"note": HOSTILE}, "/p/1/")
    assert "<script>" not in short and "&lt;script&gt;" in short and "payload-cut" not in short
    cut = long_text(HOSTILE * 200, "/p/2/")
    assert "<script>" not in cut and f"Showing the first {PREVIEW_CHARS} characters of" in cut
    assert 'hx-get="/p/2/"' in cut and "show all of it" in cut
    assert payload(None, "/p/3/") == "" == long_text(None, "/p/4/")
