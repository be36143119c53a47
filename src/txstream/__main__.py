"""``python -m txstream``: the ``txstream`` command without the console script."""

from txstream.cli import entry

entry()
