#!/usr/bin/env bash
# Make sure the PostgreSQL server binaries (initdb, pg_ctl) are present.
# Installs the Debian package `postgresql` with apt-get when they are missing
# (as root, or through sudo without a password). Exit 0 when the server is usable.
set -euo pipefail

find_initdb() {
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n -r); do
        if [ -x "$d/initdb" ]; then echo "$d/initdb"; return 0; fi
    done
    command -v initdb 2>/dev/null && return 0
    return 1
}

if found=$(find_initdb); then
    echo "pg-install: PostgreSQL server present ($found)"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
else
    echo "pg-install: PostgreSQL server missing; run as root: apt-get install -y postgresql" >&2
    exit 1
fi

echo "pg-install: installing the postgresql package with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends postgresql >/dev/null
found=$(find_initdb) || { echo "pg-install: initdb still not found after install" >&2; exit 1; }
echo "pg-install: PostgreSQL server installed ($found)"
