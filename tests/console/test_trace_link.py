"""The run page links to the run's trace in the company's tracing tool (SAGAS_TRACE_URL_TEMPLATE)."""

from __future__ import annotations

import uuid

import pytest

from sagas import start
from tests.console.conftest import client_for
from tests.console.run_data import SCRIPT, run_url, text

pytestmark = pytest.mark.django_db


def test_it_links_a_run_to_its_trace_only_when_a_url_template_is_set(people, settings):
    run = start("rp_charge_ship_wait", {"id": "o-1"})
    viewer = client_for(people["viewer"])
    assert "run-trace" not in text(viewer.get(run_url(run)))

    # A Grafana Explore link carries JSON; whatever the template holds is escaped in the page.
    settings.SAGAS_TRACE_URL_TEMPLATE = (
        'https://grafana.example/explore?left={"queries":[{"query":"{trace_id}"}]}&x="><script>alert(1)</script>')
    page = text(viewer.get(run_url(run)))
    trace_id = uuid.UUID(str(run.id)).hex
    assert ('<a class="mono" href="https://grafana.example/explore?left={&quot;queries&quot;:[{&quot;query&quot;:'
            f'&quot;{trace_id}&quot;}}]}}&amp;x=&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;" '
            f'rel="noopener noreferrer">{trace_id}</a>') in page
    assert SCRIPT not in page
