"""``python -m ha_controller.config_doc``: the command that writes docs/configuration.md.

The generator is :mod:`ha_controller.config.doc`; this module keeps the command's name.
"""

from __future__ import annotations

import sys

from ha_controller.config.doc import COMMAND, COMPONENTS, DEFAULT_PATH, TABLES, main, render
from ha_controller.config.doc_rules import rules_of

__all__ = ["COMMAND", "COMPONENTS", "DEFAULT_PATH", "TABLES", "main", "render", "rules_of"]

if __name__ == "__main__":
    sys.exit(main())
