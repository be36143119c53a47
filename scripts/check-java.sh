#!/usr/bin/env bash
# Spark needs a Java 17+ runtime: say so in one line when it is missing.
if ! command -v java >/dev/null 2>&1; then
  echo "txstream needs a Java 17+ runtime for Spark; install one, e.g.: sudo apt-get install -y openjdk-17-jre-headless" >&2
  exit 1
fi
major=$(java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}')
if [ -z "$major" ] || [ "$major" -lt 17 ]; then
  echo "txstream needs Java 17+ for Spark, found Java ${major:-unknown}; install e.g.: sudo apt-get install -y openjdk-17-jre-headless" >&2
  exit 1
fi
