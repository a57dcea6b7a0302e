"""Archive storage for retention: where archived runs are written, and how one is read back.

An archive is one file per UTC day of the runs' ``finished_at``, ``archive-YYYY-MM-DD.jsonl.gz``:
JSON Lines, gzip-compressed. Each archive batch appends its lines for that day as one gzip
*member*; gzip readers (``zcat``, Python's ``gzip``) read concatenated members as one stream,
so ``zcat archive-2026-11-01.jsonl.gz | jq`` shows the whole day. ``ArchivedRun`` records,
per run, the file's URL and its member's byte offset and length, so opening one run reads
and decompresses one member, not the whole day.

Every line is one JSON object with ``"type"`` (``run``, ``journal``, ``effect``,
``approval``, ``compensation_plan``, ``compensation_item``), ``"run_id"`` and the row's
columns as PostgreSQL stores them (``row_to_json``). A run's lines are together: its ``run``
line first.

Storage is an ``ArchiveStore``: ``append(day, member) -> (location, offset)`` makes the
member durable before it returns (the delete commits only afterwards), and ``read(location,
offset, length)``. ``file://`` is built in (``FileStore``); another scheme needs the setting
``SAGAS_ARCHIVE_WRITER``, the dotted path of a class taken with the URL.

Guarantees of ``FileStore``: ``append`` returns only after the bytes and the file's new
length are on disk (fdatasync of the file, then of its length mark; the directory once, when
the file is new). A write that fails (disk
full) is cut back off the file. A crash in the middle of a write leaves a torn member at
the end, which the next append cuts off: it trusts only the length in the file's ``.end``
mark (written before the first byte of a new file, and after each member).
A member written whose batch then failed to commit stays in the file: its lines are
duplicates of the ones a later batch writes again, and readers go by ``ArchivedRun``.
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
from collections.abc import Iterable, Iterator
from datetime import date
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

# zlib level: archiving competes with the workers for CPU; level 1 is several times faster
# than the default 6 and still shrinks JSON journal lines about tenfold.
COMPRESS_LEVEL = 1
MARK_WIDTH = 20  # digits of a file's ``.end`` mark


class ArchiveStore(Protocol):
    """Where archive members go. ``append`` must be durable when it returns."""

    def append(self, day: date, member: bytes) -> tuple[str, int]:
        """Append ``member`` (whole gzip members) to ``day``'s archive, durably; returns the
        archive's URL and the offset the member starts at."""
        ...

    def read(self, location: str, offset: int, length: int) -> bytes:
        """The ``length`` bytes at ``offset`` of the archive at ``location``."""
        ...


def file_name(day: date) -> str:
    return f"archive-{day.isoformat()}.jsonl.gz"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileStore:
    """``file:///some/dir``: one file per day in that directory (made if missing)."""

    def __init__(self, url: str) -> None:
        parsed = urlparse(url)
        if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
            raise ImproperlyConfigured(f"not a local file:// URL: {url!r}")
        self.root = Path(unquote(parsed.path))

    @staticmethod
    def path_of(location: str) -> Path:
        """The file of an archive URL this store wrote (any directory: the setting may have moved)."""
        path = Path(unquote(urlparse(location).path))
        if not (path.name.startswith("archive-") and path.name.endswith(".jsonl.gz")):
            raise ValueError(f"{location!r} is not an archive file")
        return path

    def append(self, day: date, member: bytes) -> tuple[str, int]:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / file_name(day)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # one appender at a time per file, across processes
            size = os.fstat(fd).st_size
            mark = self._open_mark(path, new=size == 0)
            try:
                raw = os.pread(mark, MARK_WIDTH, 0).strip()
                good = int(raw) if raw else size  # a file without its mark: trust it, never cut it
                if size > good:
                    os.ftruncate(fd, good)  # a torn or unmarked member left by a crash mid-write
                try:
                    written = 0
                    while written < len(member):
                        written += os.pwrite(fd, member[written:], good + written)
                    os.fdatasync(fd)
                except BaseException:
                    os.ftruncate(fd, good)  # disk full, an I/O error: leave the file as it was
                    raise
                self._write_mark(mark, good + len(member))
            finally:
                os.close(mark)
        finally:
            os.close(fd)  # releases the lock
        return path.as_uri(), good

    def _open_mark(self, path: Path, *, new: bool) -> int:
        """The file's ``.end`` mark, opened; made (marked empty, durably) with a new file, so
        that a crash in the middle of its first member is cut off too."""
        mark_path = path.with_name(path.name + ".end")
        exists = mark_path.exists()
        mark = os.open(mark_path, os.O_RDWR | os.O_CREAT, 0o640)
        if not exists:
            if new:
                self._write_mark(mark, 0)
            _fsync_dir(self.root)  # the new file and its mark outlive a crash
        return mark

    @staticmethod
    def _write_mark(mark: int, end: int) -> None:
        """Durably record ``end``, the length of the file's complete members: one fixed-width
        write at offset 0 (a single sector, so never torn), then fdatasync."""
        os.pwrite(mark, str(end).rjust(MARK_WIDTH).encode("ascii"), 0)
        os.fdatasync(mark)

    def read(self, location: str, offset: int, length: int) -> bytes:
        with open(self.path_of(location), "rb") as handle:
            handle.seek(offset)
            data = handle.read(length)
        if len(data) != length:
            raise ValueError(f"{location} holds {len(data)} of the {length} bytes at {offset}")
        return data


def store_for(url: str | None = None) -> ArchiveStore:
    """The store of ``url`` (default: the ``SAGAS_ARCHIVE_URL`` setting)."""
    url = url or settings.SAGAS_ARCHIVE_URL
    if urlparse(url).scheme == "file":
        return FileStore(url)
    if not settings.SAGAS_ARCHIVE_WRITER:
        raise ImproperlyConfigured(
            f"SAGAS_ARCHIVE_URL={url!r}: only file:// is built in; set SAGAS_ARCHIVE_WRITER to the dotted "
            "path of a class taking the URL (see sagas.retention.store.ArchiveStore)"
        )
    store: ArchiveStore = import_string(settings.SAGAS_ARCHIVE_WRITER)(url)
    return store


def store_for_location(location: str) -> ArchiveStore:
    """The store to read an archive ``location`` from: a file:// one directly, any other
    with the configured writer."""
    if urlparse(location).scheme == "file":
        return FileStore(Path(unquote(urlparse(location).path)).parent.as_uri())
    return store_for()


def member_bytes(lines: Iterable[str]) -> bytes:
    """One gzip member holding ``lines`` (JSON texts), one per line."""
    return gzip.compress("".join(f"{line}\n" for line in lines).encode("utf-8"), compresslevel=COMPRESS_LEVEL)


def member_lines(member: bytes) -> Iterator[dict[str, Any]]:
    """The JSON objects of one member (or of a whole file: members concatenated)."""
    for line in gzip.decompress(member).decode("utf-8").splitlines():
        if line:
            yield json.loads(line)


def run_lines(store: ArchiveStore, location: str, offset: int, length: int, run_id: str) -> list[dict[str, Any]]:
    """The archived lines of run ``run_id``: read from its member only."""
    return [line for line in member_lines(store.read(location, offset, length)) if line.get("run_id") == run_id]
