"""The results of actions, as messages that stay until dismissed.

A message never lives inside a live region (console/live.py): a push re-renders the region and
would take it away, as it did when the "Approved …" notices were part of the queues' fragments.
Messages go to the messages area of base.html (``#messages``), which nothing but the person's
dismiss button (console/static/console/live_morph.js) removes:

* a full page (no JavaScript, or an action's 4xx answer as a page) shows them through Django's
  messages framework, in this very response or after a redirect;
* an htmx answer carries them out of band (``message_oob``): htmx puts each on top of the area.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest
from django.template.loader import render_to_string


def page_messages(request: HttpRequest, *, error: str = "", notice: str = "") -> None:
    """Show ``error`` and ``notice`` (if any) on the page this request renders or redirects to."""
    if error:
        messages.error(request, error)
    if notice:
        messages.success(request, notice)


def message_oob(*, error: str = "", notice: str = "") -> str:
    """HTML to append to an htmx answer: ``error`` and ``notice`` (if any) as messages, swapped out
    of band into the messages area."""
    parts = [
        render_to_string("console/message_oob.html", {"level": level, "text": text})
        for level, text in (("error", error), ("success", notice)) if text
    ]
    return "".join(parts)
