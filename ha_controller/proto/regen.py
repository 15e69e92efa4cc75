"""Regenerate the *_pb2.py and *_pb2.pyi files from the .proto sources.

``python -m ha_controller.proto.regen [OUT_DIR]``; without OUT_DIR the files
are written next to their sources.  A test regenerates into a temp dir and
compares with the committed files.

The RocketMQ 5 gRPC protocol (``rocketmq/v2/*.proto``, served by ``hactl
proxy``) is generated the same way, plus the gRPC stubs (``*_pb2_grpc.py``)
of the files that declare a service (``GRPC_PROTOS``).
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
ROOT = PROTO_DIR.parent.parent
V2_DIR = PROTO_DIR / "rocketmq" / "v2"
GRPC_PROTOS = ("service.proto",)


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def v2_proto_files() -> list[Path]:
    """The RocketMQ 5 gRPC protocol sources (package ``apache.rocketmq.v2``)."""
    return sorted(V2_DIR.glob("*.proto"))


def _protoc(args: list[str], *, well_known: bool = False) -> None:
    from grpc_tools import protoc  # dev dependency only

    includes = [f"-I{ROOT}"]
    if well_known:  # google/protobuf/*.proto ship inside grpc_tools
        includes.append(f"-I{Path(protoc.__file__).resolve().parent / '_proto'}")
    rc = protoc.main(["protoc", *includes, *args])
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")


def regenerate(out_dir: Path) -> None:
    _protoc(
        [
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            *(str(p.relative_to(ROOT)) for p in proto_files()),
        ]
    )
    v2 = v2_proto_files()
    if v2:
        _protoc(
            [
                f"--python_out={out_dir}",
                f"--pyi_out={out_dir}",
                *(str(p.relative_to(ROOT)) for p in v2),
            ],
            well_known=True,
        )
        _protoc(
            [
                f"--grpc_python_out={out_dir}",
                *(str(p.relative_to(ROOT)) for p in v2 if p.name in GRPC_PROTOS),
            ],
            well_known=True,
        )


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    regenerate(out)


if __name__ == "__main__":
    main()
