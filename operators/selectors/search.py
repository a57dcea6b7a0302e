"""Search by run id or business key, shared by the runs list and the effects queue.

A term matches:

* a whole run id (a UUID): that run, or a business key spelled exactly like it;
* hex digits (dashes ignored), as the lists show ids: runs whose id starts with them (a range
  scan of the primary key: PostgreSQL orders uuids byte by byte);
* anything of three characters or more: business keys that contain it, ignoring case
  (``lower(key) LIKE lower('%term%')``, which is ``ILIKE``). For runs, the GIN index
  ``run_business_key_grams`` of every 3- and 4-character piece of each key answers it
  (``sagas.store.key_grams``, sagas migration 0029): exactly for a term of 3 or 4 characters,
  and for a longer one by narrowing the keys to those holding all its 4-character pieces, which
  are then tested. The open effects the queue searches are few and are tested one by one;
* a term ending in ``*`` (``KYC-0001*``): business keys that start with what comes before the
  star, ignoring case (``upper(business_key) LIKE 'KYC-0001%'``, the b-tree
  ``run_business_key_upper_prefix``, sagas migration 0024): a range of one index whatever the
  table's size;
* a term of one or two characters: business keys that start with it, ignoring case (the same
  index). Such a term has no piece to look up, and a substring search for it walks the whole
  table when it is rare: 1.4 s for ``zq`` at a million runs.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F, Q, Value
from django.db.models.functions import Lower
from django.db.models.lookups import Lookup
from django.db.models.sql.compiler import SQLCompiler

from sagas.integration import KEY_GRAMS_EXACT_UP_TO as EXACT_UP_TO
from sagas.integration import KEY_GRAMS_SHORTEST as SHORTEST
from sagas.integration import key_holds_grams

_HEX_PREFIX = re.compile(r"^[0-9a-f]{1,32}$")
MIN_SUBSTRING_CHARS = SHORTEST  # a key's shortest piece: shorter terms match the start of keys
PREFIX_MARK = "*"  # a term ending in it matches the start of keys


def prefix_term(term: str) -> str | None:
    """What a term asks keys to start with (``KYC-0001*`` -> ``KYC-0001``), or None when it
    does not end in ``PREFIX_MARK``. The form refuses a term that is only stars."""
    if not term.endswith(PREFIX_MARK):
        return None
    return term.rstrip(PREFIX_MARK)


def search_problem(term: str) -> str | None:
    """Why ``term`` cannot be searched (the forms and the API say it), or None. Only stars asks
    for keys that start with nothing: every run, which the list without a search already shows."""
    if term and not term.rstrip(PREFIX_MARK):
        return (f"Search: {PREFIX_MARK!r} asks for keys that start with what comes before it; "
                f"type the start of a key before it (KYC-0001{PREFIX_MARK}).")
    return None


class _Like(Lookup):
    """``lhs LIKE rhs``, usable as a filter expression."""

    lookup_name = "like"

    def as_sql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper) -> tuple[str, list[Any]]:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        return f"{lhs} LIKE {rhs}", [*lhs_params, *rhs_params]


def contains_pattern(term: str) -> str:
    """A LIKE pattern matching ``term`` anywhere, its wildcards taken literally."""
    escaped = term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def run_id_range(prefix: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The range of run ids starting with ``prefix`` (hex digits, dashes ignored), or None."""
    digits = prefix.replace("-", "").lower()
    if not _HEX_PREFIX.match(digits):
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def key_contains(term: str, *, field: str = "business_key", walk: bool = False, indexed: bool = False) -> Q:
    """A filter: ``field`` (a business key column or a path to one) contains ``term``, ignoring
    case; for a term ending in ``*`` or under ``MIN_SUBSTRING_CHARS``, starts with it. Django's
    ``istartswith`` is ``UPPER(field::text) LIKE UPPER('term%')``, the expression the
    ``run_business_key_upper_prefix`` index holds.

    "Contains, ignoring case" is ``lower(key) LIKE lower('%term%')``: what ``ILIKE`` does in a
    UTF-8 database (it lowers both sides, then compares as LIKE), without lowering the pattern
    again for every row (0.27 against 0.43 µs a key, a million keys), and the same ``lower()``
    the key-pieces index is made with. No index holds ``lower(key)``: a list that walks its rows
    in order (``walk``) tests each one with it, and finds a page of a term that matches many
    keys among the first few thousand rows whatever the table's size, where the index would read
    every match first.

    ``indexed`` (and not ``walk``): ``field`` is the runs' business key, whose pieces
    ``run_business_key_grams`` holds (``sagas.store.key_grams``): the filter is that index's
    condition, and for a term longer than one piece also the test of the candidates it finds."""
    start = prefix_term(term)
    if start is not None:
        return Q(**{f"{field}__istartswith": start})
    if len(term) < MIN_SUBSTRING_CHARS:
        return Q(**{f"{field}__istartswith": term})
    contains = Q(_Like(Lower(F(field)), Lower(Value(contains_pattern(term)))))
    if not indexed or walk:
        return contains
    held = key_holds_grams(field, term)
    return held if len(term) <= EXACT_UP_TO else held & contains


def runs_matching(term: str, *, walk: bool = False) -> Q:
    """A filter on runs: id or business key matches ``term`` (see the module docstring);
    ``walk`` as for ``key_contains``."""
    try:
        whole = uuid.UUID(term)
    except ValueError:
        match = key_contains(term, walk=walk, indexed=True)
        id_range = run_id_range(prefix_term(term) or term)
        if id_range is not None:
            match |= Q(id__range=id_range)
        return match
    return Q(id=whole) | Q(business_key=term)


def effects_matching(term: str) -> Q:
    """A filter on effect records: their run matches ``term``, read from the record's own
    columns (``run_id``, and ``business_key``, copied from the run when the record was
    inserted: ``sagas.store.effect_context``), so the open effects are searched without
    looking up their runs."""
    try:
        whole = uuid.UUID(term)
    except ValueError:
        whole = None
    if whole is not None:
        return Q(run_id=whole) | Q(business_key=term)
    match = key_contains(term)
    id_range = run_id_range(prefix_term(term) or term)
    if id_range is not None:
        match |= Q(run_id__range=id_range)
    return match
