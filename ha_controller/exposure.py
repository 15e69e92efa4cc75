"""What a server's configuration leaves unauthenticated, said once when it starts.

Open mode is a choice (the demo profile), but it should never be a surprise:
``hactl nameserver``, ``hactl broker`` (a broker container too: one line for the
process, not one per broker) and ``hactl proxy`` log one WARNING line at start-up
naming each part that is open in their actual configuration (docs/security.md):

- no ``cluster_secret``: the control plane (what cluster members say to each other);
- the client ACL off, or anonymous requests allowed: the data plane (what clients say);
- no ``admin_token`` (nameserver, broker): the admin HTTP API's mutating endpoints;
- TLS off: every byte in clear.

Nothing is logged when every part is closed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ha_controller.config import BrokerConfig, NameserverConfig, ProxyConfig

__all__ = ["open_parts", "warn_if_open"]

log = logging.getLogger(__name__)

_Config = NameserverConfig | BrokerConfig | ProxyConfig

#: per component: what a stranger can do on the control plane without the secret
_CONTROL = {
    NameserverConfig: "any process that reaches the port can register brokers, as the id 0 "
    "of a group whose master is away or as a new group advertising an existing topic",
    BrokerConfig: "any process that reaches the ports can send HA-info exchanges and "
    "min-id notices that detach a slave or fence a master, vote in lock rounds, read the "
    "metadata tables and attach to the HA port",
    ProxyConfig: "the gateway's requests to the cluster are not signed, and the cluster's "
    "members do not authenticate each other",
}
#: per component: what any client can do on the data plane without the ACL
_DATA = {
    NameserverConfig: "any client can create, update and delete topics and read every route",
    BrokerConfig: "any client can send to and consume any topic, reset any group's "
    "offsets and take its locks",
    ProxyConfig: "any gRPC client can send to and receive from any topic as any group",
}


def open_parts(cfg: _Config) -> list[str]:
    """The parts ``cfg`` leaves unauthenticated, each as "what (why: what it allows)"."""
    kind = type(cfg)
    parts = []
    if cfg.cluster_secret is None:
        parts.append(f"control plane (no cluster_secret: {_CONTROL[kind]})")
    if not cfg.acl.enabled:
        parts.append(f"data plane (acl.enabled = false: {_DATA[kind]})")
    elif cfg.acl.allow_anonymous:
        parts.append(
            "data plane (acl.allow_anonymous = true: unsigned requests are served as if "
            "there were no ACL)"
        )
    if isinstance(cfg, NameserverConfig | BrokerConfig) and cfg.admin_token is None:
        parts.append("admin HTTP API (no admin_token: its mutating endpoints take any caller)")
    if not cfg.tls.enabled:
        parts.append("every connection in clear (tls.enabled = false)")
    return parts


def warn_if_open(configs: _Config | Sequence[_Config], logger: logging.Logger = log) -> str | None:
    """Log one WARNING line naming what ``configs`` (one process: a broker container
    passes all its brokers) leave unauthenticated; the line, or None when nothing is."""
    many = configs if isinstance(configs, Sequence) else (configs,)
    parts = list(dict.fromkeys(p for cfg in many for p in open_parts(cfg)))
    if not parts:
        return None
    line = "unauthenticated: " + "; ".join(parts) + ". See docs/security.md."
    logger.warning("%s", line)
    return line
