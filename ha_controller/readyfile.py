"""The ``--ready-file`` contract: once every listener is bound, write
``{"pid", "rpc", "http"[, "ha"]}`` atomically, so tests and tools never guess
ports or sleep for readiness.  A broker container (several brokers in one
process) writes ``{"pid", "brokers": [{"name", "id", "rpc", "http", "ha"}, ...]}``."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_ready_file(path: str | Path, **addresses: object) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), **addresses}))
    os.replace(tmp, path)


def format_addr(host: str, port: int) -> str:
    """``host:port`` for a bound socket; the wildcard becomes loopback so the
    address is usable by a client on this machine."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"{host}:{port}"
