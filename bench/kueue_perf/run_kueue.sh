#!/usr/bin/env bash
# Kueue's own scheduler performance test (test/performance/scheduler in sigs.k8s.io/kueue),
# built from the Go module and run with its runner + minimalkueue against envtest's
# kube-apiserver and etcd -- the ones deploy/testenv/k8s builds (issue 30).
#
#   bench/kueue_perf/run_kueue.sh [CONFIG] [OUT]
#
# CONFIG: a folder name under the module's test/performance/scheduler/configs (default
# baseline) or a path to a generator.yaml. OUT: output folder (default
# ~/.cache/isthmus/kueue-perf/out/CONFIG-<UTC time>). The runner writes OUT/summary.yaml,
# OUT/minimalkueue.stats.yaml, OUT/cqStates.csv, OUT/wlStates.csv; this script adds
# OUT/runner.log and OUT/commands.txt. The last line printed is OUT.
#
# Build output and the Go caches stay out of the repository: binaries go to
# ~/.cache/isthmus/kueue-perf/<hash of version and toolchain>/, the module and build caches
# are Go's own (go env GOMODCACHE / GOCACHE).
set -euo pipefail

KUEUE_VERSION=${ISTHMUS_KUEUE_VERSION:-v0.17.0}
CONFIG=${1:-baseline}
CACHE=${ISTHMUS_KUEUE_PERF_CACHE:-$HOME/.cache/isthmus/kueue-perf}
HASH=$(echo "$KUEUE_VERSION $(go env GOVERSION GOOS GOARCH)" | sha256sum | cut -c1-16)
BIN=$CACHE/$HASH
MODDIR=$(go env GOMODCACHE)/sigs.k8s.io/kueue@$KUEUE_VERSION

# envtest's binaries: the test environment's own build (a folder holding etcd and
# kube-apiserver under ~/.cache/isthmus/k8s/bin/<hash>/), unless KUBEBUILDER_ASSETS is set.
if [[ -z ${KUBEBUILDER_ASSETS:-} ]]; then
  for d in "$HOME"/.cache/isthmus/k8s/bin/*/; do
    if [[ -x $d/etcd && -x $d/kube-apiserver ]]; then KUBEBUILDER_ASSETS=${d%/}; fi
  done
fi
[[ -n ${KUBEBUILDER_ASSETS:-} ]] || {
  echo "no etcd/kube-apiserver: run deploy/testenv/k8s/up once (it builds them) or set KUBEBUILDER_ASSETS" >&2
  exit 2
}
export KUBEBUILDER_ASSETS

if [[ ! -x $BIN/runner || ! -x $BIN/minimalkueue ]]; then
  mkdir -p "$BIN"
  echo "building Kueue $KUEUE_VERSION's runner and minimalkueue into $BIN" >&2
  GOBIN=$BIN GOFLAGS="-mod=mod -buildvcs=false" nice -n 10 go install -p 2 -trimpath \
    "sigs.k8s.io/kueue/test/performance/scheduler/runner@$KUEUE_VERSION" \
    "sigs.k8s.io/kueue/test/performance/scheduler/minimalkueue@$KUEUE_VERSION"
fi
[[ -d $MODDIR ]] || { echo "module not in the cache: $MODDIR" >&2; exit 2; }

if [[ -f $CONFIG ]]; then
  GEN=$(realpath "$CONFIG"); NAME=$(basename "$(dirname "$GEN")")
else
  GEN=$MODDIR/test/performance/scheduler/configs/$CONFIG/generator.yaml; NAME=$CONFIG
fi
[[ -f $GEN ]] || { echo "no generator config $GEN" >&2; exit 2; }
OUT=${2:-$CACHE/out/$NAME-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")

# The runner looks for the project's Makefile upward from its working directory: run it
# from the module's folder (read-only; it writes only to OUT). Its default record timeout is
# 10 min; a 2-core machine may need more for large configurations (RUNNER_TIMEOUT).
CMD=("$BIN/runner" --o "$OUT" --crds=config/components/crd/bases
  "--generatorConfig=$GEN" "--minimalKueue=$BIN/minimalkueue"
  "--timeout=${RUNNER_TIMEOUT:-10m}")
{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
  echo "cd $MODDIR && ${CMD[*]}"
} >"$OUT/commands.txt"
cat "$OUT/commands.txt" >&2
start=$(date +%s.%N)
(cd "$MODDIR" && "${CMD[@]}") >"$OUT/runner.log" 2>&1 || {
  tail -30 "$OUT/runner.log" >&2
  echo "runner failed (log: $OUT/runner.log)" >&2
  exit 1
}
end=$(date +%s.%N)
echo "runner wall: $(echo "$end - $start" | bc) s" >>"$OUT/commands.txt"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/commands.txt"
echo "$OUT"
