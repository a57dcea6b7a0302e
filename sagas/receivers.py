"""Signal receivers: how the engine hears about ledger resolutions."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from ledger.services import effect_resolved, effect_resolving
from sagas.resolutions import run_effect_resolved, run_lock_for_effect_resolution


@receiver(effect_resolving, dispatch_uid="sagas.effect_resolving")
def _on_effect_resolving(sender: Any, effect_id: int, **kwargs: Any) -> None:
    run_lock_for_effect_resolution(effect_id=effect_id)


@receiver(effect_resolved, dispatch_uid="sagas.effect_resolved")
def _on_effect_resolved(sender: Any, effect: Any, outcome: str, actor: str, **kwargs: Any) -> None:
    run_effect_resolved(effect=effect, outcome=outcome, actor=actor)
