#!/usr/bin/env bash
# Fail in one line when the interpreter is missing or older than 3.11.
py="${1:-python3}"
if ! command -v "$py" >/dev/null 2>&1; then
  echo "txstream needs Python 3.11+ ('$py' not found); install python3 (e.g. apt-get install -y python3 python3-venv)" >&2
  exit 1
fi
if ! "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "txstream needs Python 3.11+, but $py is $("$py" -V 2>&1); set PYTHON=python3.11 or newer" >&2
  exit 1
fi
