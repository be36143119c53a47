#!/bin/bash
# Linear Road on the shared input at a speedup, RUNS times, with a CPU hog (one busy
# Python loop) beside it: a stand-in for a slower host (issue 28's margin check).
#   scripts/lr-hog.sh [speedup=10] [runs=3] [out=/tmp/lr-hog]
# Prints each run's max response, share within 5 s and validation, from summary.json.
set -euo pipefail
speedup=${1:-10} runs=${2:-3} out=${3:-/tmp/lr-hog}
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$here/.venv/bin/python}
lr=${LR_DIR:-$here/../shared/linearroad}
"$python" -c "while True: pass" &
hog=$!
trap 'kill $hog 2>/dev/null || true' EXIT
for i in $(seq 1 "$runs"); do
  rm -rf "$out/run$i"
  PYSPARK_PYTHON=$python "$python" -m txstream.cli linear-road run \
    --input "$lr/lr-1x-1800s.dat.gz" --tolls "$lr/lr-1x-1800s.tolls.dat.gz" \
    --speedup "$speedup" --out "$out/run$i" > "$out.run$i.log" 2>&1 || echo "run $i exited $?"
  "$python" - "$out/run$i/summary.json" "$i" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
keys = [k for k in s if any(w in k for w in ("max", "within", "wrong", "missing", "valid"))]
print(f"run {sys.argv[2]}:", {k: s[k] for k in keys})
PY
done
