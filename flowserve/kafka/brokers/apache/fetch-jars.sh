#!/usr/bin/env bash
# Fetch the Apache Kafka broker and its runtime classpath from Maven Central into one flat directory, with
# Maven, so the broker can run as `java -cp "$libs/*" kafka.Kafka ...` with no Kafka tarball installed. Shipped
# in the flowserve package (pom.xml beside it); deploy/kafka/fetch-jars.sh runs it from a checkout. flowserve
# itself fetches a version it has a pinned list for (kafka-<version>.jars, written by pin-jars.sh) without
# Maven (fetch.py), and runs this script only for other versions.
#
#   bash fetch-jars.sh                    # prints the libs directory on stdout
#   bash fetch-jars.sh tools              # the console clients (kafka-tools) and their classpath, into
#                                         # a tools/ folder beside libs/ (client compatibility tests)
#
# Environment:
#   FLOWSERVE_KAFKA_VERSION  Kafka version to fetch (default 4.1.1)
#   FLOWSERVE_KAFKA_LIBS     target directory (default ~/.cache/flowserve/kafka/<version>/libs)
#   FLOWSERVE_MAVEN_URL      a Maven repository to use instead of Maven Central (a mirror)
#
# Idempotent: a complete directory carries a .complete marker and is left alone. Jars are copied into a
# sibling temp directory and renamed into place, so an interrupted or concurrent run never leaves a
# half-filled classpath that would later fail with ClassNotFoundException.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="${FLOWSERVE_KAFKA_VERSION:-4.1.1}"
libs="${FLOWSERVE_KAFKA_LIBS:-${XDG_CACHE_HOME:-$HOME/.cache}/flowserve/kafka/$version/libs}"
profile=()
if [[ "${1:-}" == "tools" ]]; then
  libs="$(dirname "$libs")/tools"
  profile=(-P tools)
fi

if [[ -f "$libs/.complete" ]]; then
  echo "$libs"
  exit 0
fi

command -v mvn >/dev/null || { echo "fetch-jars.sh: mvn not found: install Maven 3.8+ (apt-get install maven)" >&2; exit 1; }

parent="$(dirname "$libs")"
mkdir -p "$parent"
staging="$(mktemp -d "$parent/.libs-staging.XXXXXX")"
settings="$(mktemp)"
trap 'rm -rf "$staging" "$settings"' EXIT
mirror=()
if [[ -n "${FLOWSERVE_MAVEN_URL:-}" ]]; then
  printf '<settings><mirrors><mirror><id>flowserve</id><mirrorOf>*</mirrorOf><url>%s</url></mirror></mirrors></settings>\n' \
    "$FLOWSERVE_MAVEN_URL" > "$settings"
  mirror=(-s "$settings")
fi

echo "fetch-jars.sh: resolving org.apache.kafka:kafka_2.13:$version into $libs" >&2
mvn -q -B -Dstyle.color=never "${mirror[@]}" -f "$here/pom.xml" \
  -Dkafka.version="$version" "${profile[@]}" \
  dependency:copy-dependencies \
  -DincludeScope=runtime \
  -DoutputDirectory="$staging" 2>&1 | sed -e 's/\x1b\[[0-9;]*m//g' -e '/^$/d' >&2  # Maven 3.8 -q still emits colour resets

touch "$staging/.complete"
if ! mv -T "$staging" "$libs" 2>/dev/null; then
  # Another run finished first (the target now exists and is non-empty); its copy is as good as ours.
  [[ -f "$libs/.complete" ]] || { echo "fetch-jars.sh: could not move jars into $libs" >&2; exit 1; }
fi
echo "$libs"
