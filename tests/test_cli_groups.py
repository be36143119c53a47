"""The command groups (``txstream cq``, ``txstream linear-road``, ...) without a subcommand."""

from __future__ import annotations

import pytest

from txstream.cli import main

GROUPS = {
    "broadcast": "COMMAND",
    "cq": "COMMAND",
    "linear-road": "COMMAND",
    "loading": "ACTION",
    "windows": "COMMAND",
}


@pytest.mark.parametrize(("group", "metavar"), GROUPS.items())
def test_a_group_without_a_subcommand_prints_its_help_and_exits_2(
    group: str, metavar: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([group]) == 2
    out = capsys.readouterr().out
    assert out.startswith(f"usage: txstream {group} [-h] {metavar} ...\n"), out
    assert "positional arguments:" in out
