"""What each fault family needs from this machine, and why a family cannot run here.

A family is either injectable here or refused with one line naming what is missing:
``partition`` and ``loss`` need hosts in network namespaces (``--netns``, root),
``disk-full`` tmpfs mounts (root), ``power-loss`` the FUSE layer that keeps unsynced
writes apart (:mod:`ha_controller.drills.lazyfs`: ``/dev/fuse``, root, the
``hac-lazyfs`` program that ``make tools`` builds), ``clock`` the ``LD_PRELOAD`` shim
that steps one process's wall clock (:mod:`ha_controller.drills.clock`, built by ``make
tools`` too), the controller families an etcd binary (Debian's ``etcd-server``, which
``make tools`` installs) and ``controller-isolate`` hosts in network namespaces as
well.  ``corruption`` and the process families need nothing.

Where it is decided: a campaign or a ``generated`` drill whose families were *asked
for* (``--families``) refuses to start when one of them cannot run (exit 2, one line);
with the default families the ones that cannot run are skipped and listed with the
reason (:func:`unavailable_families`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from ha_controller.drills.generator import FAMILIES, NETNS_FAMILIES, families_needing

__all__ = ["NEEDS_NETNS", "refusal", "unavailable_families"]

NEEDS_NETNS: Final = "needs --netns (hosts in network namespaces)"


def _checks() -> dict[str, Callable[[], str | None]]:
    """need -> a probe returning why it is missing (None: available).  Imported lazily:
    each probe may touch the system (mount, look for a program)."""
    from ha_controller.drills.clock import clock_available
    from ha_controller.drills.cluster import tmpfs_available
    from ha_controller.drills.lazyfs import lazyfs_available
    from ha_controller.testing.etcd import etcd_missing

    def tmpfs() -> str | None:
        reason = tmpfs_available()
        return None if reason is None else f"needs tmpfs: {reason}"

    def etcd() -> str | None:
        reason = etcd_missing()
        return None if reason is None else f"needs etcd: {reason}"

    return {
        "tmpfs": tmpfs,
        "lazyfs": lazyfs_available,
        "clock-shim": clock_available,
        "etcd": etcd,
    }


def unavailable_families(families: Iterable[str], *, netns: bool) -> dict[str, str]:
    """family -> why this machine cannot fault it (families that can are left out), in
    :data:`~ha_controller.drills.generator.FAMILIES` order."""
    out: dict[str, str] = {}
    wanted = set(families)
    if wanted & NETNS_FAMILIES:
        from ha_controller.drills.netns import netns_available

        reason = NEEDS_NETNS if not netns else netns_available()
        if reason is not None:
            out.update(dict.fromkeys(sorted(wanted & NETNS_FAMILIES), reason))
    for need, probe in _checks().items():
        hit = wanted & families_needing(need)
        if hit and (reason := probe()) is not None:
            out.update(dict.fromkeys(sorted(hit), reason))
    return {f: out[f] for f in FAMILIES if f in out}


def refusal(families: Iterable[str], *, netns: bool) -> str | None:
    """One line refusing the asked-for ``families`` that cannot run here (None: all can)."""
    missing = unavailable_families(families, netns=netns)
    if not missing:
        return None
    return "; ".join(f"{f} cannot be injected here: {why}" for f, why in missing.items())
