"""Stores that lose what was not synced: the FUSE layer of the power-loss family.

``hac-lazyfs BACKING MOUNTPOINT`` (``tools/lazyfs/hac-lazyfs.c``, built by ``make
tools``) shows ``BACKING`` at ``MOUNTPOINT`` and keeps every write to a file in its own
memory until an ``fsync``/``fdatasync`` of that file writes it through (the LazyFS
approach).  A broker's store directory is such a mount; :meth:`LazyMount.power_cut`
kills the daemon with SIGKILL (after the broker): whatever the broker had written
since its last sync is gone, exactly as from a page cache when the power fails, and
``BACKING`` holds what a disk would.  :meth:`LazyMount.mount` mounts it again over the
same ``BACKING`` (power on).  File creation, rename, unlink and truncate are durable at
once (a file system that journals its metadata in order); only file data waits.

Needs root, ``/dev/fuse`` and the program; :func:`lazyfs_available` says which is
missing, in one line, and the power-loss family is skipped (or refused when asked for)
with it.  ``HAC_LAZYFS`` names the program explicitly.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

from ha_controller.protocol.errors import HaError

__all__ = ["PROGRAM", "LazyMount", "LazyfsError", "lazyfs_available", "lazyfs_program"]

PROGRAM: Final = "hac-lazyfs"
_MOUNT_TIMEOUT_S: Final = 10.0


class LazyfsError(HaError, RuntimeError):
    """The FUSE layer could not be mounted or unmounted."""


def lazyfs_program() -> Path | None:
    """``$HAC_LAZYFS``, else ``hac-lazyfs`` beside the running interpreter (``.venv/bin``,
    where ``make tools`` builds it), else on ``PATH``."""
    named = os.environ.get("HAC_LAZYFS")
    if named:
        return Path(named) if os.access(named, os.X_OK) else None
    beside = Path(sys.executable).parent / PROGRAM
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which(PROGRAM)
    return Path(found) if found else None


@functools.cache
def lazyfs_available() -> str | None:
    """``None`` when stores can be mounted through the FUSE layer here, else why not."""
    if os.geteuid() != 0:
        return "needs root (a FUSE mount per store)"
    if not os.path.exists("/dev/fuse"):
        return "needs /dev/fuse"
    if lazyfs_program() is None:
        return f"needs {PROGRAM} (build it with 'make tools': tools/build-faults.sh)"
    probe = Path(tempfile.mkdtemp(prefix="hacd-lazyfs-probe-"))
    try:
        (probe / "b").mkdir()
        (probe / "m").mkdir()
        mount = LazyMount(probe / "b", probe / "m", probe / "log")
        try:
            mount.mount()
        except LazyfsError as exc:
            return f"cannot mount {PROGRAM} here: {exc}"
        mount.unmount()
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    return None


def _mounted(path: Path) -> bool:
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return False
    target = str(path)
    return any(len(p := line.split()) > 2 and p[1] == target and p[2] == "fuse" for line in lines)


def _umount(path: Path) -> None:
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=15, check=False)


class LazyMount:
    """One store's FUSE mount: ``backing`` shown at ``mountpoint`` (blocking calls)."""

    def __init__(self, backing: Path, mountpoint: Path, log_path: Path) -> None:
        self.backing = backing
        self.mountpoint = mountpoint
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def mounted(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def mount(self) -> None:
        """Start the daemon and wait until the mount is there (idempotent)."""
        if self.mounted:
            return
        program = lazyfs_program()
        if program is None:
            raise LazyfsError(f"{PROGRAM} not found (make tools)")
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        if _mounted(self.mountpoint):  # a dead daemon's mount
            _umount(self.mountpoint)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [str(program), str(self.backing), str(self.mountpoint)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + _MOUNT_TIMEOUT_S
        while not _mounted(self.mountpoint):
            if self._proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace").strip().splitlines()[-1:]
                self._proc = None
                raise LazyfsError(f"{PROGRAM} exited: {' '.join(tail) or 'no output'}")
            if time.monotonic() > deadline:
                self.power_cut()
                raise LazyfsError(f"{self.mountpoint} not mounted after {_MOUNT_TIMEOUT_S} s")
            time.sleep(0.02)

    def power_cut(self) -> None:
        """SIGKILL the daemon (what was not synced is gone) and drop the dead mount.
        Kill the store's broker first: its files are on this mount."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        _umount(self.mountpoint)

    def unmount(self) -> None:
        """Take the mount down at the end (the daemon goes; idempotent)."""
        self.power_cut()
