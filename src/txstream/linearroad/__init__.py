"""Linear Road (Arasu et al., VLDB 2004): input generator, formats and an independent validator.

:mod:`~txstream.linearroad.formats` reads and writes the official input,
historical-tolls and answer formats; :mod:`~txstream.linearroad.generate`
produces deterministic inputs; :mod:`~txstream.linearroad.reference` computes
the expected answers with a batch (pandas) computation, and
:mod:`~txstream.linearroad.validate` compares an answers file against them.
"""
