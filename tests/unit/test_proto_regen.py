"""The committed generated protobuf modules are exactly what the .proto sources produce."""

from __future__ import annotations

from pathlib import Path

from ha_controller.proto import regen


def test_regenerating_gives_the_committed_files(tmp_path: Path) -> None:
    regen.regenerate(tmp_path)
    generated = sorted((tmp_path / "ha_controller" / "proto").glob("*_pb2.py*"))
    assert {p.name for p in generated} == {
        f"{p.stem}_pb2{ext}" for p in regen.proto_files() for ext in (".py", ".pyi")
    }
    for new in generated:
        committed = regen.PROTO_DIR / new.name
        assert committed.exists(), f"{new.name} is not committed"
        assert committed.read_text() == new.read_text(), f"{new.name} differs: run `make proto`"
