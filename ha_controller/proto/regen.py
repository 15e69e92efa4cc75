"""Regenerate the *_pb2.py and *_pb2.pyi files from the .proto sources.

``python -m ha_controller.proto.regen [OUT_DIR]``; without OUT_DIR the files
are written next to their sources.  A test regenerates into a temp dir and
compares with the committed files.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
ROOT = PROTO_DIR.parent.parent


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def regenerate(out_dir: Path) -> None:
    from grpc_tools import protoc  # dev dependency only

    args = [
        "protoc",
        f"-I{ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *(str(p.relative_to(ROOT)) for p in proto_files()),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    regenerate(out)


if __name__ == "__main__":
    main()
