#!/usr/bin/env bash
# Stop a cluster started by scripts/pg-start.sh DIR; with --rm also delete DIR.
set -euo pipefail
dir=${1:?usage: pg-stop.sh DIR [--rm]}
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n -r | head -1)
[ -n "$bindir" ] || bindir=$(dirname "$(readlink -f "$(command -v pg_ctl)")")
run=()
[ "$(id -u)" -eq 0 ] && run=(runuser -u postgres --)
if [ -f "$dir/data/postmaster.pid" ]; then
    (cd / && "${run[@]}" "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null)
fi
if [ "${2:-}" = "--rm" ]; then rm -rf "$dir"; fi
echo "pg-stop: stopped $dir"
