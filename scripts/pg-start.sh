#!/usr/bin/env bash
# Start a throwaway PostgreSQL cluster: scripts/pg-start.sh DIR [PORT]
# initdb into DIR/data (as the `postgres` user when run as root, since initdb
# refuses root), then pg_ctl start on 127.0.0.1:PORT (default: a free port).
# Prints the connection string; stop it with scripts/pg-stop.sh DIR.
set -euo pipefail
dir=${1:?usage: pg-start.sh DIR [PORT]}
here=$(cd "$(dirname "$0")" && pwd)
"$here/pg-install.sh" >/dev/null
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n -r | head -1)
[ -n "$bindir" ] || bindir=$(dirname "$(readlink -f "$(command -v initdb)")")
port=${2:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
run=()
if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$dir"
    run=(runuser -u postgres --)
fi
if [ ! -f "$dir/data/PG_VERSION" ]; then
    "${run[@]}" "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust --encoding=UTF8 \
        --locale=C --no-sync >/dev/null
    cat >>"$dir/data/postgresql.auto.conf" <<CONF
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
deadlock_timeout = '50ms'
max_connections = 40
max_locks_per_transaction = 2048
fsync = off
synchronous_commit = off
full_page_writes = off
CONF
fi
(cd / && "${run[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -o "-p $port" -w start >/dev/null)
echo "host=127.0.0.1 port=$port user=postgres dbname=postgres"
