"""Signal receivers: how the engine hears about ledger resolutions."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from ledger.services import effect_resolved
from sagas.services import run_effect_resolved


@receiver(effect_resolved, dispatch_uid="sagas.effect_resolved")
def _on_effect_resolved(sender: Any, effect: Any, outcome: str, actor: str, **kwargs: Any) -> None:
    run_effect_resolved(effect=effect, outcome=outcome, actor=actor)
