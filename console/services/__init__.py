"""The console's own writes: bulk actions (``bulk``), each item going through the same operator
action as the single button (``operators.services``)."""
