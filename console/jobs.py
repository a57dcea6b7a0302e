"""The console's background jobs. They go on the queue every engine worker reads
(``<SAGAS_QUEUE>:compensation``, ``sagas.runtime.queue``), so any live worker runs them; they take ids,
never model instances."""

from __future__ import annotations

from console.services.bulk import batch_work


def bulk_batch_work(batch_id: int) -> str:
    """Work through a confirmed bulk batch (``console.services.bulk.batch_work``)."""
    return batch_work(batch_id=int(batch_id))
