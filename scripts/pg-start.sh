#!/usr/bin/env bash
# Start a throwaway PostgreSQL cluster: scripts/pg-start.sh DIR [PORT]
# initdb into DIR/data (as the `postgres` user when run as root, since initdb
# refuses root). The server listens on no TCP port: only on a Unix socket in
# DIR, which is mode 0700, and only the user `postgres` gets in, with a random
# password (scram-sha-256) kept in DIR/password (mode 0600). PORT (default 5432)
# only names the socket file. Prints the connection string, password included;
# stop the server with scripts/pg-stop.sh DIR (it is not stopped by itself).
set -euo pipefail
dir=${1:?usage: pg-start.sh DIR [PORT]}
here=$(cd "$(dirname "$0")" && pwd)
"$here/pg-install.sh" >/dev/null
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n -r | head -1)
[ -n "$bindir" ] || bindir=$(dirname "$(readlink -f "$(command -v initdb)")")
port=${2:-5432}
mkdir -p "$dir"
chmod 700 "$dir"
dir=$(cd "$dir" && pwd)
run=()
if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$dir"
    run=(runuser -u postgres --)
fi
if [ ! -f "$dir/data/PG_VERSION" ]; then
    (umask 077 && head -c 18 /dev/urandom | base64 | tr '+/' '-_' >"$dir/password")
    [ "$(id -u)" -eq 0 ] && chown postgres: "$dir/password"
    "${run[@]}" "$bindir/initdb" -D "$dir/data" -U postgres --pwfile="$dir/password" \
        --auth-local=scram-sha-256 --auth-host=reject --encoding=UTF8 --locale=C \
        --no-sync >/dev/null
    echo "local all postgres scram-sha-256" >"$dir/data/pg_hba.conf"
    cat >>"$dir/data/postgresql.auto.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$dir'
unix_socket_permissions = 0700
password_encryption = 'scram-sha-256'
deadlock_timeout = '50ms'
max_connections = 40
max_locks_per_transaction = 2048
fsync = off
synchronous_commit = off
full_page_writes = off
CONF
    [ "$(id -u)" -eq 0 ] && chown postgres: "$dir/data/pg_hba.conf"
fi
(cd / && "${run[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -o "-p $port" -w start >/dev/null)
echo "host=$dir port=$port user=postgres password=$(cat "$dir/password") dbname=postgres"
