# Kueue for deploy/testenv/k8s/up --with-kueue. Sourced by up (after lib.sh), not executed.
# shellcheck shell=bash disable=SC2034  # variables used by up
#
# The manager is built with `go install sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION` (no
# replace directives in its go.mod) into $K8S_CACHE/kueue/<hash>/ (hash of the version and the
# toolchain), its CRDs come from the same module's config/components/crd/bases, and it runs
# out of cluster against the local apiserver with the admin kubeconfig.
#
# Webhooks: none. No ValidatingWebhookConfiguration / MutatingWebhookConfiguration is
# installed, so the apiserver never calls Kueue: in-cluster webhooks need a Service the
# apiserver can reach (no kube-proxy, no pod network here), and Kueue's internal cert
# management writes its certificates for that Service. The manager still starts its webhook
# server, on 127.0.0.1 with a self-signed pair. What is lost: Kueue's defaulting (a Job with
# the queue label is not suspended for you: create it suspended, as Isthmus and
# bench/vs_kueue.py do) and its validation of Kueue objects.

KUEUE_VERSION=${ISTHMUS_KUEUE_VERSION:-v0.17.0}
KUEUE_WEBHOOK_PORT=$((PORT_BASE + 61))
KUEUE_HEALTH_PORT=$((PORT_BASE + 62))
KUEUE_QUEUES=$HERE/kueue/queues.yaml
# ISTHMUS_KUEUE_CONFIG_EXTRA: YAML appended to the manager's Configuration (top-level keys not
# written below), e.g. a waitForPodsReady block (bench/gang_bench.py); part of the config hash
KUEUE_CONFIG_EXTRA=${ISTHMUS_KUEUE_CONFIG_EXTRA:-}
KUEUE_BUILD_HASH=$(echo "$KUEUE_VERSION $(go env GOVERSION GOOS GOARCH)" | sha256sum | cut -c1-16)
KUEUE_BIN_DIR=$K8S_CACHE/kueue/$KUEUE_BUILD_HASH
KUEUE_BIN=$KUEUE_BIN_DIR/kueue
# Kueue's CRDs are in the module it was built from
KUEUE_CRDS=$(go env GOMODCACHE)/sigs.k8s.io/kueue@$KUEUE_VERSION/config/components/crd/bases

build_kueue() {
  [[ -x $KUEUE_BIN && -d $KUEUE_CRDS ]] && return 0
  log "building Kueue $KUEUE_VERSION into $KUEUE_BIN_DIR (cold: ~3-5 min on 2 cores)"
  local t0=$SECONDS tmp
  mkdir -p "$K8S_CACHE/kueue"
  rm -rf "$K8S_CACHE"/kueue/.build.*
  tmp=$(mktemp -d "$K8S_CACHE/kueue/.build.XXXXXX")
  # go install module@version: no -mod (not in a module); -trimpath, no VCS stamp
  if ! GOBIN=$tmp GOFLAGS="-buildvcs=false" nice -n 10 \
    go install -p 2 -trimpath "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION" \
    >"$K8S_CACHE/kueue-build.log" 2>&1; then
    tail -40 "$K8S_CACHE/kueue-build.log" >&2
    rm -rf "$tmp"
    die "go install sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION failed (log: $K8S_CACHE/kueue-build.log)"
  fi
  [[ -d $KUEUE_CRDS ]] || die "Kueue's CRDs are not at $KUEUE_CRDS"
  chmod 755 "$tmp"
  rm -rf "$KUEUE_BIN_DIR"
  mv "$tmp" "$KUEUE_BIN_DIR"
  log "built Kueue in $((SECONDS - t0))s"
}

# the self-signed pair of Kueue's webhook and metrics servers (nothing calls either)
kueue_certs() {
  local dir=$K8S_STATE/kueue/certs
  mkdir -p "$dir"
  (
    umask 077
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
      -subj "/CN=kueue-testenv" -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
      -keyout "$dir/tls.key" -out "$dir/tls.crt" 2>/dev/null
  ) || die "Kueue certificate generation failed"
  # With internal cert management off the manager reads its metrics certificates from this
  # fixed path even when metrics are off; any pair will do (keep one that is there).
  if [[ ! -s /etc/kueue/metrics/certs/tls.crt ]]; then
    mkdir -p /etc/kueue/metrics/certs
    cp "$dir/tls.crt" "$dir/tls.key" /etc/kueue/metrics/certs/
  fi
}

kueue_config() {
  cat <<YAML
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:$KUEUE_HEALTH_PORT
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: $KUEUE_WEBHOOK_PORT
  certDir: $K8S_STATE/kueue/certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
clientConnection:
  qps: 50
  burst: 100
controller:
  groupKindConcurrency:
    Job.batch: 5
    Workload.kueue.x-k8s.io: 5
    LocalQueue.kueue.x-k8s.io: 1
    ClusterQueue.kueue.x-k8s.io: 1
    ResourceFlavor.kueue.x-k8s.io: 1
integrations:
  frameworks: ["batch/job"]
YAML
  if [[ -n $KUEUE_CONFIG_EXTRA ]]; then
    printf '%s\n' "$KUEUE_CONFIG_EXTRA"
  fi
}

# ClusterQueues Active: the flavors, the topology and the queues are all known to Kueue
kueue_queues_active() {
  local out
  out=$(kubectl_ get clusterqueues.kueue.x-k8s.io -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Active")].status}{"\n"}{end}') || return 1
  [[ -n $out ]] && ! grep -qv '^True$' <<<"$out"
}

start_kueue() {
  log "installing Kueue $KUEUE_VERSION CRDs"
  kubectl_ apply --server-side -f "$KUEUE_CRDS" >/dev/null || die "applying Kueue's CRDs failed"
  kubectl_ wait --for condition=established --timeout=60s -f "$KUEUE_CRDS" >/dev/null \
    || die "Kueue's CRDs were not established"
  kubectl_ create namespace kueue-system >/dev/null
  kueue_certs
  kueue_config >"$K8S_STATE/kueue/config.yaml"
  echo "$KUEUE_BIN_DIR/" >"$RUN/kueue.bin"
  log "starting kueue"
  # fd 9 (the up.lock) must not leak into the daemon; VisibilityOnDemand off: its API server
  # wants certificates of its own and nothing here uses it
  setsid "$KUEUE_BIN" --kubeconfig="$KUBECONFIG_PATH" --config="$K8S_STATE/kueue/config.yaml" \
    --feature-gates=VisibilityOnDemand=false --zap-log-level=2 \
    </dev/null >"$K8S_STATE/logs/kueue.log" 2>&1 9>&- &
  echo $! >"$RUN/kueue.pid"
  wait_for "kueue /readyz" 120 kueue \
    curl -fs --max-time 3 "http://127.0.0.1:$KUEUE_HEALTH_PORT/readyz"
  kubectl_ apply -f "$KUEUE_QUEUES" >/dev/null || die "applying $KUEUE_QUEUES failed"
  wait_for "Kueue ClusterQueues Active" 120 kueue kueue_queues_active
}
