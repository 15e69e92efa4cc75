"""The two files generated from the config classes: write one, or check it is current."""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["write_or_check"]


def write_or_check(path: Path, text: str, *, check: bool, command: str) -> int:
    """Write ``text`` to ``path`` (0), or with ``check`` only compare: 1 when it differs,
    saying on stderr that ``command`` regenerates it."""
    if check:
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            print(f"{path} is stale; regenerate it with: {command}", file=sys.stderr)
            return 1
        return 0
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0
