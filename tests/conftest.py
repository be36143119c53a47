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
"""

import os
import shutil
from pathlib import Path

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
