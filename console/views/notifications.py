"""Notifications: the deliveries page (any console role, the user's tenants) and the endpoints'
configuration (staff only: others get 403, and a POST of theirs is audited as denied)."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.notifications import services
from console.notifications.forms import DeliveriesForm, EndpointForm, RotateForm
from console.notifications.models import NotificationEndpoint, NotificationKind
from console.notifications.selectors import deliveries_page, endpoint_get, endpoints_all
from console.views.base import ConsoleRequest, actor_of, viewer_required


@require_GET
@viewer_required
def deliveries(request: ConsoleRequest) -> HttpResponse:
    form = DeliveriesForm(request.GET)
    valid = form.is_valid()
    page = deliveries_page(user=request.user, cursor=form.cleaned_data["after"], kind=form.cleaned_data["kind"]) \
        if valid else None
    context = {"form": form, "page": page, "kind": form.cleaned_data.get("kind", "") if valid else "",
               "cursor": request.GET.get("after", "") if valid else "", "is_staff": services.is_staff(request.user)}
    return render(request, "console/notifications.html", context, status=200 if valid else 400)


def _staff_page(request: ConsoleRequest, action: str, object_id: object) -> None:
    """403 for anyone but staff; their POST is audited as denied, whatever it carried."""
    if request.method == "POST":
        try:
            services.require_staff(actor_of(request), action, object_id)
        except services.NotStaff as exc:
            raise PermissionDenied(str(exc)) from exc
    elif not services.is_staff(request.user):
        raise PermissionDenied("only staff configure notifications")


def _endpoints_page(request: ConsoleRequest, form: EndpointForm, status: int = 200) -> HttpResponse:
    return render(request, "console/notification_endpoints.html",
                  {"endpoints": list(endpoints_all()), "form": form}, status=status)


@require_http_methods(["GET", "POST"])
@login_required
def endpoints(request: ConsoleRequest) -> HttpResponse:
    _staff_page(request, services.CREATE, "")
    if request.method == "GET":
        return _endpoints_page(request, EndpointForm(initial={"kinds": list(NotificationKind.values)}))
    form = EndpointForm(request.POST)
    if not form.is_valid():
        return _endpoints_page(request, form, status=400)
    endpoint = services.endpoint_create(actor=actor_of(request), values=form.values())
    messages.success(request, f"Endpoint “{endpoint.name}” added. Its signing secret is on its page.")
    return redirect("console:notification_endpoint", endpoint_id=endpoint.id)


def _endpoint_or_404(endpoint_id: int) -> NotificationEndpoint:
    endpoint = endpoint_get(endpoint_id)
    if endpoint is None:
        raise Http404("no such endpoint")
    return endpoint


def _endpoint_page(request: ConsoleRequest, endpoint: NotificationEndpoint, form: EndpointForm,
                   status: int = 200, rotate: RotateForm | None = None) -> HttpResponse:
    # A legacy endpoint's rotation is its move to Standard Webhooks: by default the old headers go
    # on for a day, so its receiver is not cut off before it deploys its new check.
    rotate = rotate or RotateForm(initial={"keep_old_hours": 24 if endpoint.is_legacy else 0})
    return render(request, "console/notification_endpoint.html",
                  {"endpoint": endpoint, "form": form, "rotate": rotate, "overlap_until": endpoint.overlap_until()},
                  status=status)


def _settings_form(endpoint: NotificationEndpoint) -> EndpointForm:
    return EndpointForm(initial={"name": endpoint.name, "url": endpoint.url, "format": endpoint.format,
                                 "kinds": endpoint.kinds, "tenants": ", ".join(endpoint.tenants),
                                 "active": endpoint.active})


@require_http_methods(["GET", "POST"])
@login_required
def endpoint(request: ConsoleRequest, endpoint_id: int) -> HttpResponse:
    _staff_page(request, services.UPDATE, endpoint_id)
    found = _endpoint_or_404(endpoint_id)
    if request.method == "GET":
        return _endpoint_page(request, found, _settings_form(found))
    form = EndpointForm(request.POST)
    if not form.is_valid():
        return _endpoint_page(request, found, form, status=400)
    services.endpoint_update(actor=actor_of(request), endpoint_id=found.id, values=form.values())
    messages.success(request, f"Endpoint “{form.values()['name']}” saved.")
    return redirect("console:notification_endpoint", endpoint_id=found.id)


@require_POST
@login_required
def endpoint_rotate(request: ConsoleRequest, endpoint_id: int) -> HttpResponse:
    _staff_page(request, services.ROTATE, endpoint_id)
    found = _endpoint_or_404(endpoint_id)
    form = RotateForm(request.POST)
    if not form.is_valid():
        return _endpoint_page(request, found, _settings_form(found), status=400, rotate=form)
    hours = form.cleaned_data["keep_old_hours"] or 0  # none given: stop now
    services.endpoint_rotate_secret(actor=actor_of(request), endpoint_id=found.id, keep_old=timedelta(hours=hours))
    messages.success(request, "A new Standard Webhooks secret was made; give it to the receiver. " + (
        f"The old one signs too for {hours} hour(s)." if hours else "The old one no longer signs."))
    return redirect("console:notification_endpoint", endpoint_id=found.id)
