"""The index behind the console's "business key contains" search: every 3- and 4-character
piece of a run's key, lower-cased, in one GIN index (``run_business_key_grams``, sagas
migration 0029), in place of ``pg_trgm``'s trigram index.

Why not the trigrams. A trigram index answers ``ILIKE '%KYC-0001%'`` by intersecting the
posting lists of every trigram of the term, and ``pg_trgm`` also adds word-boundary trigrams
(``'  0'``, ``' 00'``: every key with a number after a dash). When all of a term's trigrams
are common, GIN walks lists as long as the table, though only 1,250 keys match: 30 ms at a
million runs, 50 ms at ten million. Four characters are far rarer than three (``0001`` against
``000``), so the same term reads a list of a few thousand entries (3 ms at a million runs).

What the pieces promise:

* a key contains a term of 3 or 4 characters, ignoring case, exactly when the key's pieces
  hold the term, lower-cased: the index answers it alone, with nothing to test again;
* a key that contains a longer term holds each of the term's 4-character pieces, so the index
  narrows the candidates, which are then tested (a key can hold every piece in another order).

Both sides go through PostgreSQL's own ``lower()``, as does the test of the candidates
(``lower(key) LIKE lower('%term%')``, which is what ``ILIKE`` does in a UTF-8 database), so
"contains, ignoring case" means the same thing to the index and to the test, whatever the
characters. Terms under 3 characters are not searched here: they
match the start of keys (``operators.selectors.search``).

The functions are ``IMMUTABLE`` (an index expression must be), so a query names
``saga_key_grams(business_key)`` exactly as the index does and PostgreSQL matches the two;
``saga_term_grams(term)`` (the 4-character pieces of ``saga_key_grams(term)``, or a 3-character
term itself) is folded to a constant once per query. ``saga_key_grams`` is PL/pgSQL: 7 to 9 µs a
key, against 17 to 23 for the same pieces in one SQL statement, which is what an index build over
every run pays (a run's insert pays it once).
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.lookups import DataContains
from django.db.models import Expression, F, Func, Q, TextField, Value

GRAMS_SQL = """
CREATE OR REPLACE FUNCTION saga_key_grams(key text) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    lowered text := lower(key);
    pieces text[] := '{}';
BEGIN
    FOR i IN 1 .. length(lowered) - 2 LOOP
        pieces := pieces || substr(lowered, i, 3);
    END LOOP;
    FOR i IN 1 .. length(lowered) - 3 LOOP
        pieces := pieces || substr(lowered, i, 4);
    END LOOP;
    RETURN pieces;
END $$;
COMMENT ON FUNCTION saga_key_grams(text) IS
    'Every 3- and 4-character piece of lower(key): the console''s business-key search (sagas.store.key_grams).';
CREATE OR REPLACE FUNCTION saga_term_grams(term text) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN length(term) <= 3 THEN ARRAY[lower(term)]
                ELSE ARRAY(SELECT piece FROM unnest(saga_key_grams(term)) AS piece WHERE length(piece) = 4) END
$$;
COMMENT ON FUNCTION saga_term_grams(text) IS
    'The pieces of saga_key_grams a key holds if it contains term, ignoring case (sagas.store.key_grams).';
"""
DROP_GRAMS_SQL = """
DROP FUNCTION IF EXISTS saga_term_grams(text);
DROP FUNCTION IF EXISTS saga_key_grams(text);
"""

EXACT_UP_TO = 4  # a term this long or shorter is one piece: the index alone answers it
SHORTEST = 3


class KeyGrams(Func):
    """``saga_key_grams(key)``: the expression the index holds."""

    function = "saga_key_grams"
    output_field = ArrayField(TextField())


class TermGrams(Func):
    """``saga_term_grams(term)``: what a key containing ``term`` holds."""

    function = "saga_term_grams"
    output_field = ArrayField(TextField())


def key_holds_grams(field: str | Expression, term: str) -> Q:
    """A filter: the key in ``field`` holds every piece of ``term`` (at least ``SHORTEST``
    characters): the index's condition. For a term of up to ``EXACT_UP_TO`` characters this is
    "contains, ignoring case"; for a longer one the caller tests the candidates too."""
    if len(term) < SHORTEST:
        raise ValueError(f"a term of under {SHORTEST} characters has no piece to look up: {term!r}")
    key = F(field) if isinstance(field, str) else field
    return Q(DataContains(KeyGrams(key), TermGrams(Value(term, output_field=TextField()))))
