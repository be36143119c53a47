"""The architecture's one-way dependencies, checked on the source.

model <- storage <- txn <- engines (cq, windows, broadcast, loading, linearroad)
                         <- spark (the runtime; no engine)
      <- jobs (the engines' Spark jobs: engines + spark, never pyspark)
      <- bench / cli.  Only txstream.spark imports pyspark.
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
    "txn": {"errors", "model", "storage"},
    # The runtime (txstream.spark, its executor runtime txstream.spark.runtime
    # included) stands on the core only: no engine, no job.
    "spark": {"errors", "model", "storage", "txn"},
}
ENGINES = {"cq", "windows", "broadcast", "loading", "linearroad"}
for engine in ENGINES:
    ALLOWED[engine] = {"errors", "model", "storage", "txn", "testing"}
ALLOWED["jobs"] = {"errors", "model", "storage", "txn", "testing", "spark", *ENGINES}


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def layer_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def problems_in(package: Path) -> list[str]:
    problems = []
    for path in sorted(package.rglob("*.py")):
        layer = path.relative_to(package).parts[0].removesuffix(".py")
        allowed = ALLOWED.get(layer)
        where = path.relative_to(package)
        for name in sorted(imports(path)):
            parts = name.split(".")
            if parts[0] == "pyspark" and layer != "spark":
                problems.append(f"{where} imports {name} outside txstream.spark")
            if allowed is None or parts[0] != "txstream" or len(parts) < 2:
                continue
            if parts[1] != layer and parts[1] not in allowed:
                problems.append(f"{where} imports {name}")
    return problems


def test_layers_import_only_downwards() -> None:
    assert not problems_in(PACKAGE)


def test_the_check_catches_an_engine_in_spark_and_pyspark_in_jobs(tmp_path: Path) -> None:
    # The rules themselves, on a package that breaks each of them once.
    (tmp_path / "spark").mkdir()
    (tmp_path / "spark" / "runtime").mkdir()
    (tmp_path / "jobs").mkdir()
    (tmp_path / "spark" / "glue.py").write_text("from txstream.linearroad import engine\n")
    (tmp_path / "spark" / "runtime" / "x.py").write_text("import txstream.cq\nimport pyspark\n")
    (tmp_path / "jobs" / "lr.py").write_text(
        "import txstream.linearroad\nimport txstream.spark\n"
        "def f():\n    from pyspark.sql import functions\n"
    )
    (tmp_path / "jobs" / "ok.py").write_text("from txstream.bench import registry\n")
    assert problems_in(tmp_path) == [
        "jobs/lr.py imports pyspark.sql outside txstream.spark",
        "jobs/ok.py imports txstream.bench",
        "spark/glue.py imports txstream.linearroad",
        "spark/runtime/x.py imports txstream.cq",
    ]


def test_every_package_is_in_a_layer() -> None:
    # A new package must be placed in ALLOWED (or be a top-level module) so the
    # check above covers it.
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages - set(ALLOWED) <= {"bench"}, packages - set(ALLOWED)


def test_core_cli_jobs_and_runtime_import_without_pyspark() -> None:
    # Importing any of these may not import pyspark (let alone start a JVM):
    # pyspark is imported inside the spark functions that need it.
    jobs = sorted(f"txstream.jobs.{p.stem}" for p in (PACKAGE / "jobs").glob("[!_]*.py"))
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
    assert len(jobs) >= 5, jobs
    subprocess.run([sys.executable, "-c", code], check=True)
