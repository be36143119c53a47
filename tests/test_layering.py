"""The architecture's one-way dependencies, checked on the source.

model <- storage <- txn <- engines (cq, windows, broadcast, loading, linearroad)
      <- spark / bench / cli.  Only txstream.spark imports pyspark.
"""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "txstream"

# What each layer may import from txstream (besides itself).
ALLOWED = {
    "model": {"errors"},
    "storage": {"errors", "model"},
    # cli_types: the checked argparse number types (imports only errors), for
    # the command-line modules that live inside txn and the engines.
    "txn": {"errors", "cli_types", "model", "storage"},
}
ENGINES = {"cq", "windows", "broadcast", "loading", "linearroad"}
for engine in ENGINES:
    ALLOWED[engine] = {"errors", "cli_types", "model", "storage", "txn", "testing"}
ALLOWED["cli_types"] = {"errors"}


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_layers_import_only_downwards() -> None:
    problems = []
    for path in PACKAGE.rglob("*.py"):
        layer = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        allowed = ALLOWED.get(layer)
        for name in imports(path):
            parts = name.split(".")
            if parts[0] == "pyspark" and layer != "spark":
                problems.append(f"{path.name} imports pyspark outside txstream.spark")
            if allowed is None or parts[0] != "txstream" or len(parts) < 2:
                continue
            if parts[1] != layer and parts[1] not in allowed:
                problems.append(f"{layer}/{path.name} imports {name}")
    assert not problems, problems


def test_core_and_cli_start_without_a_jvm() -> None:
    code = (
        "import sys, txstream, txstream.model, txstream.cli, txstream.bench.registry\n"
        "txstream.cli.build_parser()\n"
        "txstream.model.criteria()\n"
        "assert 'pyspark' not in sys.modules, 'pyspark imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
