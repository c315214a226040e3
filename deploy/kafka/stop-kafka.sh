#!/usr/bin/env bash
# Stop the cluster that start-kafka.sh started and delete its data. Does nothing if none is running.
set -euo pipefail

run="${FLOWSERVE_KAFKA_RUN:-${TMPDIR:-/tmp}/flowserve-kafka-run}"
[[ -d "$run" ]] || { echo "stop-kafka.sh: nothing running ($run does not exist)" >&2; exit 0; }

if [[ -f "$run/pids" ]]; then
  mapfile -t pids < "$run/pids"
  for pid in "${pids[@]}"; do
    # SIGCONT first: a node paused by a fault test would hold the SIGTERM until resumed.
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
  done
  # A controlled shutdown of a 3-node cluster can take a while; the data is discarded, so cap it.
  for _ in $(seq 20); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    (( alive )) || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
fi

if [[ -f "$run/data" ]]; then
  rm -rf "$(cat "$run/data")"
fi
rm -rf "$run"
echo "stop-kafka.sh: stopped" >&2
