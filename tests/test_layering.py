"""The architecture's one-way dependencies, checked on the source.

model <- storage <- txn <- engines (cq, windows, broadcast, loading, linearroad)
                         <- spark (the runtime; no engine)
      <- jobs (the engines' Spark jobs: engines + spark, never pyspark)
      <- bench <- cli.  Only txstream.spark imports pyspark.

A module's layer is its top-level package, with one exception inside an
engine's package, so that each engine's job lives beside it: a module named
``*_job`` is in the jobs layer (``linearroad/spark_job.py``).  Every command
lives in the ``cli`` package (``cli/cq.py`` is ``txstream cq``), so no engine
module may import the command line, argparse or click.  At the top of
``src/txstream/`` only ``__init__``, ``errors``, ``testing``, ``__main__``
(``python -m txstream``) and the ``cli`` package may live.
"""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "txstream"

ENGINES = {"cq", "windows", "broadcast", "loading", "linearroad"}
TOP_MODULES = {"__init__", "__main__", "errors", "testing"}

# What each layer may import from txstream (besides itself).
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "model": {"errors"},
    "storage": {"errors", "model"},
    "txn": {"errors", "model", "storage"},
    # Fault injection and in-memory helpers for tests of code built on txstream.
    "testing": {"errors", "model", "storage", "txn"},
    # The runtime (txstream.spark, its executor runtime txstream.spark.runtime
    # included) stands on the core only: no engine, no job.
    "spark": {"errors", "model", "storage", "txn"},
}
for engine in ENGINES:
    ALLOWED[engine] = {"errors", "model", "storage", "txn", "testing"}
ALLOWED["jobs"] = {"errors", "model", "storage", "txn", "testing", "spark", *ENGINES}
# The bench harness runs the jobs; the command line stands on it.
ALLOWED["bench"] = {*ALLOWED["jobs"], "jobs"}
ALLOWED["cli"] = {*ALLOWED["bench"], "bench", "__version__"}
# `python -m txstream` is the command line's entry.
ALLOWED["__main__"] = {*ALLOWED["cli"], "cli"}
# The front door (`import txstream as tx`) re-exports the API; never the CLI.
ALLOWED["__init__"] = {*ALLOWED["jobs"], "jobs"}


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function.

    ``from txstream.a import b`` counts as ``txstream.a`` and ``txstream.a.b``
    (``b`` may be a module): the layer of a module inside a package is not
    always the package's.
    """
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def layer_of(parts: tuple[str, ...]) -> str:
    """The layer of the module ``txstream.<parts>`` (the rule in this file's docstring)."""
    if parts[0] in ENGINES and len(parts) > 1 and parts[1].endswith("_job"):
        return "jobs"
    return parts[0]


def problems_in(package: Path) -> list[str]:
    """Every import in ``package`` that points up or sideways, and every stray top module."""
    problems = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package)
        parts = where.with_suffix("").parts
        if len(parts) == 1 and parts[0] not in TOP_MODULES:
            problems.append(f"{where} is a module at the top (only {sorted(TOP_MODULES)})")
        layer = layer_of(parts)
        allowed = ALLOWED.get(layer)
        if allowed is None:
            continue  # a stray top module (above) or a package not in a layer (below)
        reported: list[str] = []
        for name in sorted(imports(path)):
            if any(name.startswith(f"{r}.") for r in reported):
                continue  # once per import statement
            names = name.split(".")
            if names[0] == "pyspark" and layer != "spark":
                reported.append(name)
                problems.append(f"{where} imports {name} outside txstream.spark")
            if names[0] in ("argparse", "click") and layer not in ("cli", "bench"):
                reported.append(name)
                problems.append(f"{where} imports {name}: commands live in txstream.cli")
            if names[0] != "txstream" or len(names) < 2:
                continue
            imported = layer_of(tuple(names[1:]))
            if imported == layer or imported in allowed or ".".join(names[1:3]) in allowed:
                continue
            reported.append(name)
            problems.append(f"{where} imports {name}")
    return problems


def test_layers_import_only_downwards() -> None:
    assert not problems_in(PACKAGE)


def test_the_check_catches_each_kind_of_upward_import(tmp_path: Path) -> None:
    # The rules themselves, on a package that breaks each of them once.
    for folder in ("spark/runtime", "jobs", "txn", "linearroad", "cq"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "spark" / "glue.py").write_text("from txstream.linearroad import engine\n")
    (tmp_path / "spark" / "runtime" / "x.py").write_text("import txstream.cq\nimport pyspark\n")
    (tmp_path / "jobs" / "lr.py").write_text(
        "import txstream.linearroad\nimport txstream.spark\n"
        "def f():\n    from pyspark.sql import functions\n"
    )
    (tmp_path / "jobs" / "ok.py").write_text("from txstream.bench import registry\n")
    (tmp_path / "txn" / "stress.py").write_text("from txstream.cli.types import seed\n")
    # An engine's own job may not be imported by the engine itself, whichever
    # way the import is spelt; the job may import the engine.  An engine holds
    # no command (those live in txstream.cli).
    (tmp_path / "linearroad" / "engine.py").write_text(
        "from txstream.linearroad import spark_job\n"
    )
    (tmp_path / "linearroad" / "spark_job.py").write_text(
        "from txstream.linearroad import engine\nfrom txstream.spark import sql\n"
    )
    (tmp_path / "linearroad" / "cli.py").write_text(
        "from txstream.cli.types import seed\nfrom txstream.linearroad import spark_job\n"
    )
    (tmp_path / "cq" / "engine.py").write_text("from txstream.cli.types import seed\n")
    (tmp_path / "cq" / "cli.py").write_text("import argparse\nimport click.types\n")
    (tmp_path / "linearroad_run.py").write_text("from txstream.errors import TxStreamError\n")
    (tmp_path / "errors.py").write_text("")
    assert problems_in(tmp_path) == [
        "cq/cli.py imports argparse: commands live in txstream.cli",
        "cq/cli.py imports click.types: commands live in txstream.cli",
        "cq/engine.py imports txstream.cli.types",
        "jobs/lr.py imports pyspark.sql outside txstream.spark",
        "jobs/ok.py imports txstream.bench",
        "linearroad/cli.py imports txstream.cli.types",
        "linearroad/cli.py imports txstream.linearroad.spark_job",
        "linearroad/engine.py imports txstream.linearroad.spark_job",
        "linearroad_run.py is a module at the top"
        " (only ['__init__', '__main__', 'errors', 'testing'])",
        "spark/glue.py imports txstream.linearroad",
        "spark/runtime/x.py imports txstream.cq",
        "txn/stress.py imports txstream.cli.types",
    ]


def test_every_package_is_in_a_layer() -> None:
    # A new package must be placed in ALLOWED so the check above covers it.
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= set(ALLOWED), packages - set(ALLOWED)


def test_core_cli_jobs_and_runtime_import_without_pyspark() -> None:
    # Importing any of these may not import pyspark (let alone start a JVM):
    # pyspark is imported inside the spark functions that need it.
    jobs = sorted(f"txstream.jobs.{p.stem}" for p in (PACKAGE / "jobs").glob("[!_]*.py"))
    jobs += sorted(
        f"txstream.{p.parent.name}.{p.stem}" for p in PACKAGE.glob("*/*_job.py")
    )  # the engines' own job modules
    spark = sorted(
        ".".join(("txstream", *p.relative_to(PACKAGE).with_suffix("").parts))
        for p in (PACKAGE / "spark").rglob("[!_]*.py")
    )
    modules = ["txstream", "txstream.model", "txstream.cli", "txstream.bench.registry"]
    modules += ["txstream.jobs", *jobs, "txstream.spark", *spark]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "import txstream.cli, txstream.model\n"
        "txstream.cli.build_parser()\n"
        "txstream.model.criteria()\n"
        "assert 'pyspark' not in sys.modules, 'pyspark imported'\n"
    )
    assert len(jobs) >= 7, jobs
    subprocess.run([sys.executable, "-c", code], check=True)
