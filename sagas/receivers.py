"""Signal receivers: how the engine hears about ledger resolutions and flow control."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from ledger.services import effect_resolved, effect_resolving
from ledger.signals import tickets_granted
from sagas.resolutions import run_effect_resolved, run_lock_for_effect_resolution
from sagas.waits import runs_wake_released


@receiver(effect_resolving, dispatch_uid="sagas.effect_resolving")
def _on_effect_resolving(sender: Any, effect_id: int, **kwargs: Any) -> None:
    run_lock_for_effect_resolution(effect_id=effect_id)


@receiver(effect_resolved, dispatch_uid="sagas.effect_resolved")
def _on_effect_resolved(sender: Any, effect: Any, outcome: str, actor: str, **kwargs: Any) -> None:
    run_effect_resolved(effect=effect, outcome=outcome, actor=actor)


@receiver(tickets_granted, dispatch_uid="sagas.tickets_granted")
def _on_tickets_granted(sender: Any, runs: list[str], **kwargs: Any) -> None:
    runs_wake_released(run_ids=runs)
