#!/usr/bin/env bash
# A Spark standalone cluster on this machine (loopback): one master, N workers.
#
#   scripts/spark-cluster.sh start DIR [WORKERS] [CORES_PER_WORKER]   # prints the master URL
#   scripts/spark-cluster.sh stop DIR
#
# The pip package of PySpark has no start-master.sh: the daemons are started
# with its spark-class, in the background, their logs, work folders and pids
# in DIR (DIR/master.url holds the URL).  Ports are free ones picked at start,
# so several clusters (and test runs) can live side by side.  Then:
#
#   spark-submit --master "$(cat DIR/master.url)" job.py
#
# with PYSPARK_PYTHON set to the project's interpreter (make cluster-start).
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z "$cmd" || -z "$dir" ]]; then
    echo "usage: $0 start DIR [WORKERS] [CORES_PER_WORKER] | stop DIR" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYSPARK_PYTHON:-$here/.venv/bin/python}

stop() {
    local pid
    for pidfile in "$dir"/*.pid; do
        [[ -e "$pidfile" ]] || continue
        pid=$(cat "$pidfile")
        # spark-class execs java: the pid is the daemon's JVM
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$pidfile"
    done
    rm -f "$dir/master.url"
}

case "$cmd" in
start)
    workers=${3:-2}
    cores=${4:-1}
    if [[ ! "$workers" =~ ^[1-9][0-9]*$ || ! "$cores" =~ ^[1-9][0-9]*$ ]]; then
        echo "$0: WORKERS and CORES_PER_WORKER are positive integers, not '$workers' '$cores'" >&2
        exit 2
    fi
    if [[ -e "$dir/master.url" ]]; then
        echo "$0: a cluster runs in $dir already ($(cat "$dir/master.url")); stop it first" >&2
        exit 2
    fi
    mkdir -p "$dir"
    home=$("$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
    read -r port ui <<<"$("$python" - <<'EOF'
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
EOF
)"
    export SPARK_HOME=$home SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON=$python
    url="spark://127.0.0.1:$port"
    "$home/bin/spark-class" org.apache.spark.deploy.master.Master \
        --host 127.0.0.1 --port "$port" --webui-port "$ui" >"$dir/master.log" 2>&1 &
    echo $! >"$dir/master.pid"
    for _ in $(seq 300); do
        grep -q "New state: ALIVE" "$dir/master.log" 2>/dev/null && break
        if ! kill -0 "$(cat "$dir/master.pid")" 2>/dev/null; then
            echo "$0: the master did not start: see $dir/master.log" >&2
            stop
            exit 1
        fi
        sleep 0.1
    done
    for n in $(seq "$workers"); do
        mkdir -p "$dir/work-$n"
        "$home/bin/spark-class" org.apache.spark.deploy.worker.Worker \
            --host 127.0.0.1 --cores "$cores" --memory 1g --webui-port 0 \
            --work-dir "$dir/work-$n" "$url" >"$dir/worker-$n.log" 2>&1 &
        echo $! >"$dir/worker-$n.pid"
    done
    for _ in $(seq 600); do
        registered=$(grep -c "Registering worker" "$dir/master.log" || true)
        [[ "$registered" -ge "$workers" ]] && break
        sleep 0.1
    done
    if [[ "$registered" -lt "$workers" ]]; then
        echo "$0: $registered of $workers workers registered in 60 s: see $dir/worker-*.log" >&2
        stop
        exit 1
    fi
    echo "$url" >"$dir/master.url"
    echo "$url"
    ;;
stop)
    stop
    ;;
*)
    echo "usage: $0 start DIR [WORKERS] [CORES_PER_WORKER] | stop DIR" >&2
    exit 2
    ;;
esac
