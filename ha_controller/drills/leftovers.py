"""What a drill process killed with SIGKILL leaves behind, and removing it.

A drill cluster (:class:`ha_controller.drills.cluster.DrillCluster`) works in a
directory ``<tmp>/hacd-<owner>-XXXXXXXX`` where ``<owner>`` is the pid, in hex, of the
process that started it (the same owner tag as its network namespaces,
:mod:`ha_controller.drills.netns`).  Its nameservers and brokers run in that directory
(their working directory; their ready files and stores are inside it) and a disk-full
drill mounts each broker's store there as a tmpfs.  :meth:`DrillCluster.close` removes
all of it, but a drill (or campaign) process killed with SIGKILL never gets there: its
service processes keep running as orphans, the tmpfs stores stay mounted and, with
``--netns``, the namespaces, veths and bridge stay up.

:func:`cleanup_stale` removes what belongs to an owner that is gone: it kills the
processes that run in (or name) such a directory, lazily unmounts what is mounted under
it, deletes it, and removes the stale network resources
(:func:`ha_controller.drills.netns.cleanup_stale`).  What belongs to a live owner —
another drill running on this machine — and every directory that does not carry an
owner tag is left alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Final

from ha_controller.drills.netns import NS_PREFIX, NetworkError, owner_alive
from ha_controller.drills.netns import cleanup_stale as cleanup_stale_network

__all__ = ["cleanup_stale", "stale_processes", "workdir_prefix"]

log = logging.getLogger(__name__)

#: ``hacd-<owner hex>-<mkdtemp suffix>`` (the suffix never holds a ``-``)
_WORKDIR: Final = re.compile(rf"{re.escape(NS_PREFIX)}([0-9a-f]+)-[^-/]+")
_KILL_WAIT_S: Final = 5.0
#: in the command line of every process a drill cluster starts (testing.hactl_argv),
#: and of the FUSE daemons of its power-loss stores (drills.lazyfs)
_SERVICES: Final = ("-m ha_controller.cli ", "hac-lazyfs ")


def workdir_prefix() -> str:
    """The ``tempfile.mkdtemp`` prefix of a drill cluster's work directory."""
    return f"{NS_PREFIX}{os.getpid():x}-"


def _stale_workdirs(tmp: Path) -> list[Path]:
    try:
        entries = list(tmp.iterdir())
    except OSError:
        return []
    return sorted(
        p
        for p in entries
        if (m := _WORKDIR.fullmatch(p.name)) and not owner_alive(m.group(1)) and p.is_dir()
    )


def stale_processes(workdirs: list[Path]) -> dict[int, str]:
    """pid -> command line of the ha-controller processes (``python -m
    ha_controller.cli ...``, as a drill cluster starts them, and ``hac-lazyfs``) that run
    in, or name, one of ``workdirs``; anything else there (a shell, a ``tail -f``) is not
    ours to kill."""
    if not workdirs:
        return {}
    roots = [str(w) for w in workdirs]
    out: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone, or not ours to look at
            continue
        if not any(service in argv for service in _SERVICES):
            continue
        inside = any(cwd == r or cwd.startswith(r + "/") for r in roots)
        if inside or any(r + "/" in argv for r in roots):
            out[int(entry.name)] = argv.strip()
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _kill(pids: list[int]) -> None:
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):  # a paused process dies as well
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
    deadline = time.monotonic() + _KILL_WAIT_S
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _mounts_under(workdir: Path) -> list[str]:
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return []
    root = str(workdir) + "/"
    points = [line.split()[1] for line in lines if len(line.split()) > 1]
    points = [p.encode().decode("unicode_escape") for p in points]  # \040 for a blank
    return sorted((p for p in points if p.startswith(root)), key=len, reverse=True)


def cleanup_stale(tmp: Path | None = None) -> list[str]:
    """Remove what drill processes that are gone left behind (module docstring);
    returns one line per thing removed."""
    removed: list[str] = []
    workdirs = _stale_workdirs(Path(tmp or tempfile.gettempdir()))
    procs = stale_processes(workdirs)
    if procs:
        _kill(list(procs))
        removed.extend(f"process {pid} ({argv[:160]})" for pid, argv in sorted(procs.items()))
    for workdir in workdirs:
        for point in _mounts_under(workdir):
            try:
                done = subprocess.run(
                    ["umount", "-l", point], capture_output=True, text=True, timeout=15, check=False
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("cannot unmount %s: %s", point, exc)
                continue
            if done.returncode != 0:
                log.warning("cannot unmount %s: %s", point, done.stderr.strip())
                continue
            removed.append(f"mount {point}")
        shutil.rmtree(workdir, ignore_errors=True)
        removed.append(f"directory {workdir}")
    try:
        removed.extend(cleanup_stale_network())
    except NetworkError as exc:
        log.debug("network leftovers not checked: %s", exc)
    if removed:
        log.warning("removed what a stopped drill left behind: %s", "; ".join(removed))
    return removed
