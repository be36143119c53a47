"""Every bundled example history gets the verdicts its paper gives."""

from pathlib import Path

import pytest

from txstream.model import CheckOptions, check, parse
from txstream.model.notation import expected_verdicts

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples" / "histories").glob("*.txt"))
CASES = [
    pytest.param(h, id=f"{path.stem}-{i}")
    for path in EXAMPLES
    for i, h in enumerate(parse(path.read_text(), str(path)), start=1)
]


def test_there_are_examples() -> None:
    assert len(CASES) >= 5


@pytest.mark.parametrize("history", CASES)
def test_example_matches_its_paper(history) -> None:  # type: ignore[no-untyped-def]
    expected = expected_verdicts(history)
    assert expected, "every example states the verdicts its source gives"
    n = history.meta.get("subwindows")
    options = CheckOptions(subwindows=int(n) if n else None)
    for criterion, holds in expected.items():
        assert check(history, criterion, options).holds is holds, criterion
