"""Linear Road (Arasu et al., VLDB 2004): everything about it, from the input files to the command.

The engine layer (no Spark): :mod:`~txstream.linearroad.formats` reads and
writes the official input, historical-tolls and answer formats;
:mod:`~txstream.linearroad.generate` produces deterministic inputs;
:mod:`~txstream.linearroad.replay` numbers the lines and replays them (with a
faulty source's duplicates);
:mod:`~txstream.linearroad.txns` is the transaction function of the main job
(and of the not-serializable variant's two jobs, whose TOLLS store is
:mod:`~txstream.linearroad.tollstore`) and :mod:`~txstream.linearroad.engine`
the driver engine (Figure 3's stores under the transaction manager);
:mod:`~txstream.linearroad.reference` computes the expected answers with a
batch (pandas) computation,
:mod:`~txstream.linearroad.validate` compares an answers file against them and
:mod:`~txstream.linearroad.report` sums up a run (response times, counts, latency plot).

The jobs layer (modules named ``*_job``: on :mod:`txstream.spark`, never
pyspark): :mod:`~txstream.linearroad.runtime_job` declares the main job on the
partitioned runtime (``tx.Job``), :mod:`~txstream.linearroad.spark_job` replays
the input through Spark into the driver engine,
:mod:`~txstream.linearroad.generate_job` generates inputs as Spark tasks and
:mod:`~txstream.linearroad.run_job` runs a whole job (input, state, replay,
answers, validation, report).

The command ``txstream linear-road`` is :mod:`txstream.cli.linearroad`, in the
command line layer.  ``tests/test_layering.py`` checks that each module imports only
from its own layer and below.
"""
