"""The command's entry points, and its groups (``txstream cq``, ...) without a subcommand."""

from __future__ import annotations

import subprocess
import sys

import pytest

from txstream import __version__
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


@pytest.mark.parametrize("module", ["txstream", "txstream.cli"])
def test_python_m_runs_the_command(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--version"], capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (0, f"txstream {__version__}\n"), done.stderr
