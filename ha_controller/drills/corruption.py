"""Damage to a broker's store, as a failing disk or an operator's mistake does it.

:func:`corrupt_store` applies one of :data:`~ha_controller.drills.generator.CORRUPTIONS`
to the files of a store directory (the broker may be running or stopped; the drill
restarts it afterwards):

``truncate-segment``
    the newest commit-log segment with data is cut short at a point inside its last
    64 KiB of records (a file system that lost the file's tail);
``flip-bits``
    1 to 4 bits are flipped inside the last 64 KiB of records of that segment (a bad
    sector under a record the consumers may still read);
``delete-consume-queue``
    one consume-queue file is deleted;
``delete-table``
    one metadata table (``*.json`` in the store's top directory: topics, consumer
    offsets, delay offsets, the timer checkpoint...) is deleted.

What is damaged is drawn from the ``rng``; the return value says what was done, for
the history's fault ``detail``.  A store without anything of the kind is left alone
and says so (a young slave may have no consume queue yet).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Final

__all__ = ["RECENT_BYTES", "corrupt_store", "written_end"]

#: how far back from the end of the written records damage lands
RECENT_BYTES: Final = 64 * 1024
_CHUNK: Final = 1 << 16
#: files of the store's top directory that are not metadata tables
_NOT_TABLES: Final = frozenset({"lock", "checkpoint"})


def written_end(path: Path) -> int:
    """The offset after the last non-zero byte of ``path`` (segments are preallocated
    with zeros; a record never ends in a zero run as long as a whole chunk)."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        end = size
        while end > 0:
            start = max(end - _CHUNK, 0)
            fh.seek(start)
            chunk = fh.read(end - start)
            stripped = chunk.rstrip(b"\0")
            if stripped:
                return start + len(stripped)
            end = start
    return 0


def _newest_segment(store: Path) -> tuple[Path, int] | None:
    segments = sorted((store / "commitlog").glob("[0-9]" * 20), reverse=True)
    for seg in segments:
        end = written_end(seg)
        if end > 0:
            return seg, end
    return None


def _truncate(store: Path, rng: random.Random) -> str:
    found = _newest_segment(store)
    if found is None:
        return "no commit-log records to truncate"
    seg, end = found
    cut = rng.randrange(max(end - RECENT_BYTES, 0), end)
    os.truncate(seg, cut)
    return f"segment {seg.name} truncated at {cut} (records ended at {end})"


def _flip(store: Path, rng: random.Random) -> str:
    found = _newest_segment(store)
    if found is None:
        return "no commit-log records to flip bits in"
    seg, end = found
    flipped = []
    fd = os.open(seg, os.O_RDWR)
    try:
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(max(end - RECENT_BYTES, 0), end)
            bit = rng.randrange(8)
            byte = os.pread(fd, 1, at)[0]
            os.pwrite(fd, bytes([byte ^ (1 << bit)]), at)
            flipped.append(f"{at}.{bit}")
        os.fsync(fd)
    finally:
        os.close(fd)
    return f"segment {seg.name}: bits flipped at {', '.join(flipped)}"


def _delete_consume_queue(store: Path, rng: random.Random) -> str:
    files = sorted(p for p in (store / "consumequeue").glob("*/*/*") if p.is_file())
    if not files:
        return "no consume-queue file to delete"
    victim = rng.choice(files)
    victim.unlink()
    return f"consume-queue file {victim.relative_to(store)} deleted"


def _delete_table(store: Path, rng: random.Random) -> str:
    tables = sorted(p for p in store.glob("*.json") if p.is_file() and p.name not in _NOT_TABLES)
    if not tables:
        return "no metadata table to delete"
    victim = rng.choice(tables)
    victim.unlink()
    return f"metadata table {victim.name} deleted"


_ACTIONS: Final = {
    "truncate-segment": _truncate,
    "flip-bits": _flip,
    "delete-consume-queue": _delete_consume_queue,
    "delete-table": _delete_table,
}


def corrupt_store(store: Path, variant: str, rng: random.Random) -> str:
    """Apply ``variant`` to the store in ``store`` (module docstring); what was done."""
    action = _ACTIONS.get(variant)
    if action is None:
        raise ValueError(f"unknown corruption {variant!r}; known: {', '.join(_ACTIONS)}")
    return action(store, rng)
