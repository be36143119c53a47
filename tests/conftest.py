"""Shared test configuration: Hypothesis profiles, the temporary folders' place.

``HYPOTHESIS_PROFILE=thorough`` runs many more examples than the default profile
that ``make test`` uses.

Temporary folders (``tmp_path``) live in memory (``/dev/shm``) when the machine
has it and ``--basetemp`` is not given: the stores ``fsync`` every file they
write (thousands per Hypothesis test), which on this machine's disk took most
of the suite's time (a test of 24 s ran in 3 s in memory). The code under test
is the same, ``fsync`` calls included; only power loss tells the two apart, and
no test can cause one. Each run has its own folder, removed at its end unless a
test failed (the folder's path is then printed); a later run removes the folders
of runs that are gone. Under pytest-xdist (``make test``) each worker's folders
are in a ``popen-gwN`` folder of the run's (xdist passes ``--basetemp`` to the workers).

Under ``make test`` (pytest-xdist's ``worksteal``) the slowest tests, listed in
:data:`SLOW`, start first, dealt module by module to the front of each worker's share:
xdist hands each worker a contiguous share of the collection and an idle worker
steals from the end of the other's, so with the long tests first the run ends
on short ones on both workers instead of one worker waiting out a long Spark
test alone.  Only the order changes; every test runs.
"""

import itertools
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """One local SparkSession for the whole test run (Spark takes ~10 s to start)."""
    from txstream.spark import local_session

    session = local_session("txstream-tests")
    yield session
    session.stop()


SLOW = (
    # Measured with --durations, one process, slowest first; a test missing here only runs later.
    "tests/test_runtime_spark.py::test_ledger_audit_survives_sigkills_mid_run_exactly_once",
    "tests/test_runtime_spark.py::test_a_sigkilled_driver_takes_its_jvm_down",
    "tests/test_runtime_spark.py::test_sensor_alerts_survive_sigkills",
    "tests/test_runtime_spark.py::test_local_cluster_gives_the_answers_of_local",
    "tests/test_spark_cluster.py::test_a_job_submitted_to_a_standalone_cluster_runs_there",
    "tests/test_spark_connect.py::test_ledger_through_connect_equals_the_classic_session",
    "tests/test_spark_end_inputs.py::test_a_driver_sigkilled_at_the_end_loses_and_repeats",
    "tests/test_loading_executors.py::test_driver_sigkilled_mid_batch_then_restarted",
    "tests/test_lr_spark.py::test_ctrl_c_mid_run_is_one_line_and_a_rerun_at_another_speedup",
    "tests/test_lr_validate.py::test_agreement_with_independent_reference_on_1800_seconds",
    "tests/test_lr_spark.py::test_not_serializable_two_queries_survive_sigkill",
    "tests/test_lr_spark.py::test_sigkill_mid_run_then_rerun_resumes_with_every_answer_once",
    "tests/test_loading_executors.py::test_sessions_run_as_tasks_with_no_statement",
    "tests/test_lr_runtime.py::test_every_answer_is_right_on_a_generated_input",
    "tests/test_user_jobs.py::test_inventory_with_deletes_reinserts_and_kits_equals_serial",
    "tests/test_windows_spark.py::test_windows_run_spark_on_local_cluster",
    "tests/test_windows_spark.py::test_keyed_windows_survive_driver_sigkills_exactly_once",
    "tests/test_cq_spark.py::test_windows_spanning_micro_batches",
    "tests/test_spark_connect.py::test_a_connect_query_restarts_from_its_checkpoint",
    "tests/test_cq_spark.py::test_concurrent_updaters_never_mix_versions",
    "tests/test_spark_session.py::test_a_failing_job_prints_its_one_line_error",
    "tests/test_lr_engine.py::test_repeated_sigkill_and_resume_lose_and_repeat_no_answer",
    "tests/test_lr_paths.py::test_the_not_serializable_errors_come_from_the_order_of_the_two",
    "tests/test_cq_spark.py::test_time_windows_spanning_micro_batches",
    "tests/test_user_jobs.py::test_a_rate_table_updated_by_a_change_stream_prices_payments",
    "tests/test_sinks.py::test_sigkill_delta_and_postgres_exactly_once",
    "tests/test_typed_api.py::test_a_users_program_is_checked_against_pysparks_types",
    "tests/test_bench_runtime_spark.py::test_a_uniform_audited_point_on_more_partitions",
    "tests/test_cq_spark.py::test_a_driver_killed_after_saving_a_batch_loses_no_result",
    "tests/test_lr_paths.py::test_a_crash_between_a_minute_commit_and_its_publication",
    "tests/test_cq_user.py::test_spark_two_joins_and_a_float_time_window_under_updates",
    "tests/test_lr_spark.py::test_duplicates_and_garbage_on_spark",
    "tests/test_cq_spark.py::test_two_tables_joined_in_a_chain",
    "tests/test_lr_generate.py::test_spark_generator_writes_the_same_files",
    "tests/test_cq_spark.py::test_bench_point_measures_a_mode_against_the_same_input",
    "tests/test_cq_spark.py::test_the_executors_judge_each_window_as_its_read_set_does",
    "tests/test_pgserver.py::test_sigkill_of_a_real_loading_run_stops_its_server",
)
"""Node-id prefixes of the slowest tests, slowest first (see the module's docstring)."""


def deal_slow_first(ids: list[str], slow: tuple[str, ...], workers: int) -> list[int]:
    """An order of ``ids`` (as indices) in which ``slow`` tests open each worker's share.

    xdist's ``worksteal`` gives worker k the k-th of ``workers`` contiguous
    shares (the first ``len // workers`` items, then half of the rest, ...).
    The slow tests of one module stay together, in collection order, so that
    its module-scoped fixtures are set up once for them; the modules, by their
    slowest test's place in ``slow``, are dealt in turn to the shares' fronts,
    and the other tests fill the rest in their collection order.
    """

    def rank(nodeid: str) -> int | None:
        return next((r for r, prefix in enumerate(slow) if nodeid.startswith(prefix)), None)

    modules: dict[str, tuple[int, list[int]]] = {}
    for i, nodeid in enumerate(ids):
        r = rank(nodeid)
        if r is not None:
            module = nodeid.partition("::")[0]
            best, members = modules.get(module, (r, []))
            modules[module] = (min(best, r), [*members, i])
    chosen = {i for _r, members in modules.values() for i in members}
    rest = iter([i for i in range(len(ids)) if i not in chosen])
    sizes, left = [], len(ids)
    for k in range(workers):  # as xdist's WorkStealingScheduling.check_schedule splits
        sizes.append(left // (workers - k))
        left -= sizes[-1]
    shares: list[list[int]] = [[] for _ in range(workers)]
    for n, (_r, members) in enumerate(sorted(modules.values())):
        shares[n % workers].extend(members)
    for share, size in zip(shares, sizes, strict=True):
        share.extend(itertools.islice(rest, max(0, size - len(share))))
    return [i for share in shares for i in share] + list(rest)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Tell xdist's workers the run's ``--dist`` mode (xdist sets theirs to ``no``)."""
    node.workerinput["txstream_dist"] = node.config.getoption("dist")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist's ``worksteal``, the :data:`SLOW` tests first in each worker's share."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or workerinput.get("txstream_dist") != "worksteal":
        return
    order = deal_slow_first([item.nodeid for item in items], SLOW, int(workerinput["workercount"]))
    items[:] = [items[i] for i in order]


MEMORY = Path("/dev/shm")
_MEMORY_BASETEMP = pytest.StashKey[Path]()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pytest_configure(config: pytest.Config) -> None:
    """Put this run's temporary folders in memory (see the module's docstring)."""
    if config.option.basetemp or not MEMORY.is_dir() or not os.access(MEMORY, os.W_OK):
        return
    home = MEMORY / f"txstream-pytest-{os.getuid()}"
    home.mkdir(mode=0o700, exist_ok=True)
    for old in home.glob("run-*"):  # left by failed runs whose process is gone
        pid = old.name.removeprefix("run-")
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    config.option.basetemp = str(home / f"run-{os.getpid()}")
    config.stash[_MEMORY_BASETEMP] = Path(config.option.basetemp)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove this run's folder in memory, unless a test failed (then say where it is)."""
    folder = session.config.stash.get(_MEMORY_BASETEMP, None)
    if folder is None:
        return
    if exitstatus == 0:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        print(f"\ntemporary folders of this run (removed by the next run): {folder}")
