#!/bin/bash
# One point of `txstream bench runtime` (its quick grid's parameters) on two checkouts,
# one after the other: `scripts/runtime-ab.sh BASE/src NEW/src [pattern] [audit_every] [master]`.
# Prints txn/s, steady txn/s and errors of each; compare them only within one run.
set -euo pipefail
base_src=$1 new_src=$2 pattern=${3:-cross} audits=${4:-0} master=${5:-local[2]}
cores=${master//[^0-9]/}; cores=${cores:-2}
python=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
point="{\"engine\":\"executors\",\"master\":\"$master\",\"cores\":$cores,\"partitions\":$cores,\
\"pattern\":\"$pattern\",\"cross_partition_pct\":0,\"skew\":0.0,\"accounts\":100000,\
\"audit_every\":$audits,\"cross_mode\":\"forward\",\"events\":300000,\"rate\":250000,\
\"input_seed\":1,\"seed\":1}"
for src in "$base_src" "$new_src"; do
  mkdir -p "$out/run"
  PYTHONPATH=$src PYSPARK_PYTHON=$python "$python" -m txstream.bench.runtime "$point" "$out/run" \
    | "$python" -c "import json,sys; d=json.loads([l for l in sys.stdin if l.startswith('{')][-1]);
print(f\"$src: {d['txn_per_s']:,.0f} txn/s, steady {d['steady_txn_per_s']:,.0f}, errors {d['errors']}\")"
  rm -rf "$out/run"
done
