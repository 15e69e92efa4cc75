"""Stepping one process's wall clock: the clock family's shim and its control file.

``libhac-clock.so`` (``tools/faults/clock.c``, built by ``make tools``) is preloaded
into every nameserver and broker of a cluster that runs clock faults
(``LD_PRELOAD``); it adds the nanoseconds held in the process's own control file
(``HAC_CLOCK_FILE``, mapped shared, read on every call) to ``CLOCK_REALTIME`` and what
derives from it (``time.time()``, ``gettimeofday``), never to ``CLOCK_MONOTONIC``: the
step an NTP daemon makes, contained to one process.  :class:`ClockControl` writes
that file, so a step takes effect at once.

Why not the alternatives: a time namespace (``unshare --time``) offsets only the
monotonic and boot-time clocks, never the wall clock; libfaketime 0.9.10 (Debian 12)
either fakes the monotonic clock too or, with ``FAKETIME_DONT_FAKE_MONOTONIC=1``, fails
every ``clock_nanosleep`` (Python's ``time.sleep``) with EINVAL.
"""

from __future__ import annotations

import functools
import os
import struct
import sys
from pathlib import Path
from typing import Final

__all__ = ["SHIM", "ClockControl", "clock_available", "clock_shim"]

SHIM: Final = "libhac-clock.so"
_OFFSET: Final = struct.Struct("=q")
_FILE_SIZE: Final = 4096


def clock_shim() -> Path | None:
    """``$HAC_CLOCK_SHIM``, else ``libhac-clock.so`` beside the running interpreter
    (``.venv/bin``, where ``make tools`` builds it)."""
    named = os.environ.get("HAC_CLOCK_SHIM")
    path = Path(named) if named else Path(sys.executable).parent / SHIM
    return path if path.is_file() else None


@functools.cache
def clock_available() -> str | None:
    """``None`` when processes can get a wall clock of their own here, else why not."""
    if clock_shim() is None:
        return f"needs {SHIM} (build it with 'make tools': tools/build-faults.sh)"
    return None


class ClockControl:
    """One process's clock file: the offset its wall clock runs at (blocking calls)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset_s = 0.0
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.stat().st_size < _FILE_SIZE:
            path.write_bytes(bytes(_FILE_SIZE))

    def env(self) -> dict[str, str]:
        """What the process's environment needs for the shim to read this file."""
        shim = clock_shim()
        if shim is None:
            return {}
        preload = " ".join(filter(None, [str(shim), os.environ.get("LD_PRELOAD", "")]))
        return {"LD_PRELOAD": preload, "HAC_CLOCK_FILE": str(self.path)}

    def set_offset(self, seconds: float) -> None:
        """Run the wall clock ``seconds`` ahead of the real one (negative: behind)."""
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.pwrite(fd, _OFFSET.pack(round(seconds * 1e9)), 0)
        finally:
            os.close(fd)
        self.offset_s = seconds

    def step(self, seconds: float) -> None:
        """Step the wall clock by ``seconds`` from where it is."""
        self.set_offset(self.offset_s + seconds)
