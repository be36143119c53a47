"""txstream: transactional stream processing for Python.

The package is layered; dependencies point one way::

    model <- storage <- txn <- engines (cq, windows, broadcast, loading, linearroad)
          <- spark / cli

Only :mod:`txstream.spark` imports pyspark, so ``import txstream`` never starts a JVM.
"""

from txstream.errors import NotationError, TransientError, TxStreamError, UnknownNameError

__all__ = ["NotationError", "TransientError", "TxStreamError", "UnknownNameError"]
__version__ = "0.1.0"
