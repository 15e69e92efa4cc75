from __future__ import annotations

import os

# Service processes started by tests must not inherit a developer's HAC_* settings.
for _key in [k for k in os.environ if k.startswith("HAC_")]:
    del os.environ[_key]
