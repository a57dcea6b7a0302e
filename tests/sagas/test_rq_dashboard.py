"""django-rq's queue dashboard, mounted at /django-rq/ for staff."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from operators.roles import OPERATOR, ensure_groups
from sagas.runtime.queue import compensation_queue_name, enqueue_advance, get_queue

pytestmark = pytest.mark.django_db


def _client(*, staff: bool) -> Client:
    ensure_groups()
    user = get_user_model().objects.create_user("staff" if staff else "olga", password="pw-long-enough", is_staff=staff)
    user.groups.add(Group.objects.get(name=OPERATOR))
    client = Client()
    client.force_login(user)
    return client


def test_it_shows_staff_the_compensation_queue_and_its_jobs():
    run_id = str(uuid.uuid4())
    assert enqueue_advance(run_id, "0" * 64, compensating=True)
    client = _client(staff=True)

    home = client.get("/django-rq/")
    assert home.status_code == 200
    assert compensation_queue_name() in home.content.decode()

    [job_id] = get_queue(compensation_queue_name()).job_ids
    jobs = client.get("/django-rq/queues/0/")
    assert jobs.status_code == 200
    assert job_id in jobs.content.decode() and "sagas.runtime.jobs.advance" in jobs.content.decode()
    job = client.get(f"/django-rq/queues/0/{job_id}/")
    assert job.status_code == 200 and run_id in job.content.decode()


def test_it_sends_an_operator_who_is_not_staff_to_the_admin_login():
    run_id = str(uuid.uuid4())
    assert enqueue_advance(run_id, "0" * 64, compensating=True)
    client = _client(staff=False)

    for url in ("/django-rq/", "/django-rq/queues/0/", "/django-rq/stats.json"):
        response = client.get(url)
        assert response.status_code in (302, 401), (url, response.status_code)
        assert run_id not in response.content.decode()
        assert compensation_queue_name() not in response.content.decode()
        if response.status_code == 302:
            assert response["Location"].startswith("/admin/login/"), response["Location"]
