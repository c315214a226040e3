#!/usr/bin/env bash
# Fetch the Apache Kafka jars (CI, start-kafka.sh): runs the script flowserve ships beside ApacheKafka, in
# flowserve/kafka/brokers/apache/, with the same environment (FLOWSERVE_KAFKA_VERSION, FLOWSERVE_KAFKA_LIBS).
# Prints the libs directory on stdout.
set -euo pipefail
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/flowserve/kafka/brokers/apache/fetch-jars.sh" "$@"
