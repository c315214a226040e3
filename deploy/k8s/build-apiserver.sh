#!/usr/bin/env bash
# Build a real kube-apiserver from the Kubernetes sources on the Go module proxy, for the tests of
# `flowserve tune --kubernetes` (tests/integration/test_tuner_kubernetes.py); etcd and kubectl come from
# Debian (etcd-server, kubectl). No cluster is needed: the tuner only talks to the API server.
#
# Why build: no release binary is reachable from CI (dl.k8s.io, GitHub releases), the module proxy is.
# The k8s.io/kubernetes module points its k8s.io/* staging modules at ./staging, which module zips leave
# out; the same versions are published as their own modules (v0.MINOR.PATCH), so go.mod is rewritten to
# take those. About 10 minutes on 2 cores with an empty module cache; cached afterwards.
#
# Prints the binary's path. FLOWSERVE_K8S_VERSION (default 1.34.4), FLOWSERVE_K8S_BIN (default
# ~/.cache/flowserve/k8s/<version>).
set -euo pipefail
version="${FLOWSERVE_K8S_VERSION:-1.34.4}"
bin="${FLOWSERVE_K8S_BIN:-$HOME/.cache/flowserve/k8s/$version}"
out="$bin/kube-apiserver"
if [ -x "$out" ]; then echo "$out"; exit 0; fi
command -v go >/dev/null || { echo "build-apiserver: Go is needed to build kube-apiserver" >&2; exit 1; }

work="$(mktemp -d)"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
dir="$(go mod download -json "k8s.io/kubernetes@v$version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
cp -r "$dir" "$work/src"
chmod -R u+w "$work/src"
cd "$work/src"
rm -f go.work go.work.sum
staging="v0.${version#1.}"
python3 - "$staging" <<'EOF'
import re, sys
text = open("go.mod").read()
text = re.sub(r"^\s*k8s\.io/[\w.-]+ => \./staging/src/k8s\.io/[\w.-]+\n", "", text, flags=re.M)
text = re.sub(r"^(\s*k8s\.io/[\w.-]+) v0\.0\.0$", r"\1 " + sys.argv[1], text, flags=re.M)
open("go.mod", "w").write(text)
EOF
mkdir -p "$bin"
GOFLAGS=-mod=mod go build -trimpath -o "$out.tmp" ./cmd/kube-apiserver >&2
mv "$out.tmp" "$out"
echo "$out"
