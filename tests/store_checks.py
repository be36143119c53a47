"""Checks of a runtime store's commit markers, shared by the store and Spark tests."""

from __future__ import annotations

import zlib
from pathlib import Path

from txstream.spark.runtime.state import RuntimeStore


def assert_markers_name_their_files(root: Path) -> int:
    """Every committed marker lists exactly its batch's outputs, histories and failure records,
    each with the CRC-32 and size of the file as it is; returns how many files they name."""
    store = RuntimeStore(root)
    named = 0
    for batch, info in store.chain():
        suffix = f"batch-{batch:012d}"
        folders = [root / kind / suffix for kind in ("history", "errors")]
        folders += [d / suffix for d in (root / "outputs").glob("*") if d.is_dir()]
        on_disk = {
            str(p.relative_to(root)): p.read_bytes()
            for folder in folders
            if folder.is_dir()
            for p in folder.iterdir()
            if not p.name.startswith(".")
        }
        assert set(info["files"]) == set(on_disk), (batch, info["files"], sorted(on_disk))
        for rel, raw in on_disk.items():
            assert info["files"][rel] == [zlib.crc32(raw), len(raw)], rel
        named += len(on_disk)
    return named
