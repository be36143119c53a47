"""``python -m txstream.cli``: the ``txstream`` command without the console script."""

from txstream.cli import entry

entry()
