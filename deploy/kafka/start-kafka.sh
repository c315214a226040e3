#!/usr/bin/env bash
# Start Apache Kafka 4 (KRaft, every node both broker and controller) on 127.0.0.1 for development and
# tests, in the background, with all data in a temporary directory. Prints the bootstrap address.
#
#   deploy/kafka/start-kafka.sh                  # one node, broker on 9092, controller on 9093
#   deploy/kafka/start-kafka.sh --nodes 3        # brokers on 9092-9094, controllers on 9095-9097
#   deploy/kafka/start-kafka.sh --port 19092     # first broker port
#   deploy/kafka/stop-kafka.sh                   # stop it and delete its data
#
# Brokers take ports P..P+N-1 and controllers the N ports after them, as flowserve.kafka.brokers does.
# Environment: FLOWSERVE_KAFKA_RUN (state directory, default ${TMPDIR:-/tmp}/flowserve-kafka-run),
# JAVA_HOME, and the FLOWSERVE_KAFKA_VERSION / FLOWSERVE_KAFKA_LIBS of fetch-jars.sh.
# The settings mirror ApacheKafka in flowserve/kafka/brokers/apache_kafka.py; change both together.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# ApacheKafka's log4j2.properties (and the fetch-jars.sh that ./fetch-jars.sh runs): package data of flowserve
apache="$(cd "$here/../../flowserve/kafka/brokers/apache" && pwd)"
nodes=1
port=9092
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) nodes="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "start-kafka.sh: unknown argument $1 (use --nodes 1|3, --port P)" >&2; exit 2 ;;
  esac
done
[[ "$nodes" == 1 || "$nodes" == 3 ]] || { echo "start-kafka.sh: --nodes must be 1 or 3" >&2; exit 2; }

if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
  java="$JAVA_HOME/bin/java"
else
  java="$(command -v java)" || { echo "start-kafka.sh: java not found: install Java 17+ or set JAVA_HOME" >&2; exit 1; }
fi

run="${FLOWSERVE_KAFKA_RUN:-${TMPDIR:-/tmp}/flowserve-kafka-run}"
if [[ -f "$run/pids" ]]; then
  echo "start-kafka.sh: a cluster from $run is running (bootstrap $(cat "$run/bootstrap")); run stop-kafka.sh first" >&2
  exit 1
fi

libs="$("$here/fetch-jars.sh")"
mkdir -p "$run"
data="$(mktemp -d "${TMPDIR:-/tmp}/flowserve-kafka.XXXXXX")"
echo "$data" > "$run/data"

# Kafka cluster ids are 16 random bytes in unpadded URL-safe base64; avoid a leading '-' (an option).
cluster_id=""
while [[ -z "$cluster_id" || "$cluster_id" == -* ]]; do
  cluster_id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
done

replicas=$(( nodes < 3 ? nodes : 3 ))
min_isr=$(( nodes == 1 ? 1 : 2 ))
voters=""
bootstrap=""
for (( i = 0; i < nodes; i++ )); do
  voters+="${voters:+,}$i@127.0.0.1:$(( port + nodes + i ))"
  bootstrap+="${bootstrap:+,}127.0.0.1:$(( port + i ))"
done

jvm=("$java" -Xmx512m -Xms128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true
     "-Dlog4j2.configurationFile=$apache/log4j2.properties" -cp "$libs/*")

for (( i = 0; i < nodes; i++ )); do
  home="$data/node-$i"
  mkdir -p "$home"
  cat > "$home/server.properties" <<PROPS
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$(( port + i )),CONTROLLER://127.0.0.1:$(( port + nodes + i ))
advertised.listeners=PLAINTEXT://127.0.0.1:$(( port + i ))
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$home/data
num.partitions=4
default.replication.factor=$replicas
auto.create.topics.enable=true
offsets.topic.replication.factor=$replicas
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=$replicas
transaction.state.log.min.isr=$min_isr
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=$replicas
share.coordinator.state.topic.min.isr=$min_isr
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=500
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
num.network.threads=2
num.io.threads=2
PROPS
done

# Formatting is mostly JVM start-up, so all nodes format at once.
format_pids=()
for (( i = 0; i < nodes; i++ )); do
  "${jvm[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$data/node-$i/server.properties" \
    > "$data/node-$i/format.log" 2>&1 &
  format_pids+=($!)
done
for (( i = 0; i < nodes; i++ )); do
  if ! wait "${format_pids[$i]}"; then
    echo "start-kafka.sh: formatting node $i failed:" >&2
    tail -n 20 "$data/node-$i/format.log" >&2
    rm -rf "$data" "$run"
    exit 1
  fi
done

: > "$run/pids"
echo "$bootstrap" > "$run/bootstrap"
for (( i = 0; i < nodes; i++ )); do
  nohup "${jvm[@]}" kafka.Kafka "$data/node-$i/server.properties" > "$data/node-$i/broker.log" 2>&1 &
  echo $! >> "$run/pids"
done

# log4j2.properties lets exactly this INFO line through.
deadline=$(( SECONDS + 120 ))
for (( i = 0; i < nodes; i++ )); do
  pid="$(sed -n "$(( i + 1 ))p" "$run/pids")"
  until grep -q "Kafka Server started" "$data/node-$i/broker.log" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null || (( SECONDS > deadline )); then
      echo "start-kafka.sh: node $i did not start; last lines of $data/node-$i/broker.log:" >&2
      tail -n 30 "$data/node-$i/broker.log" >&2
      "$here/stop-kafka.sh" >&2
      exit 1
    fi
    sleep 0.2
  done
done

echo "start-kafka.sh: $nodes node(s) up, logs in $data/node-*/broker.log" >&2
echo "$bootstrap"
