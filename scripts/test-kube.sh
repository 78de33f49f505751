#!/usr/bin/env bash
# A private Kubernetes API server (kube-apiserver + etcd, no kubelet) for Gantry's Kubernetes
# runtime tests and CI.
#
#   bash scripts/test-kube.sh build    # build kube-apiserver once from Debian's `kubernetes` source
#                                      # package into the cache (about 4 minutes on 2 cores)
#   bash scripts/test-kube.sh start    # build if needed, start etcd and the API server; the last
#                                      # lines printed are GANTRY_TEST_KUBE_SERVER=, _TOKEN= and _CA=
#   bash scripts/test-kube.sh stop     # stop both and delete the state dir
#   bash scripts/test-kube.sh status   # the three lines when the server answers, exit 1 otherwise
#
# Why this and not kind, k3s or envtest: none of them can be fetched here (no container registry,
# no Go module proxy), while Debian ships the Kubernetes 1.20.2 sources, Go 1.19 and etcd 3.4.
# The tree's own Makefile generates its code and builds offline. There is no kubelet, scheduler
# or controller-manager: the tests play the kubelet by patching `pods/status` (or by running a
# pod's container on the private Docker engine, see crates/gantry/tests/it/kubernetes.rs).
#
# Environment:
#   GANTRY_TEST_KUBE_DIR   state dir (etcd data, certs, token file, logs)   default /tmp/gantry-test-kube
#   GANTRY_CACHE_DIR       the built kube-apiserver                          default $HOME/.cache/gantry
#   GANTRY_TEST_KUBE_PORT  the API server's secure port                       default 16443
set -euo pipefail

D=${GANTRY_TEST_KUBE_DIR:-/tmp/gantry-test-kube}
CACHE=${GANTRY_CACHE_DIR:-${HOME:-/root}/.cache/gantry}
PORT=${GANTRY_TEST_KUBE_PORT:-16443}
ETCD_PORT=$((PORT + 1))
ETCD_PEER_PORT=$((PORT + 2))
K8S_VERSION=1.20.2
K8S_DEB=1.20.5+really1.20.2-1.1+deb12u1
BIN=$CACHE/kubernetes/$K8S_VERSION/kube-apiserver
TOKEN=gantry-test-admin

log() { printf '[test-kube %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }

# The Debian archive the machine installs from, for one deb-src line of our own: apt's lists and
# source configuration stay untouched (a private Dir::Etc::SourceList and Dir::State::Lists).
debian_mirror() {
  local uri
  uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -1)
  [ -n "$uri" ] || uri=$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | grep -v security | head -1)
  echo "${uri:-http://deb.debian.org/debian}"
}

build() {
  if [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -q "v$K8S_VERSION"; then
    log "kube-apiserver $K8S_VERSION is cached at $BIN"
    return
  fi
  command -v go >/dev/null || { log "installing golang-go (to build kube-apiserver)"; as_root apt-get install -y -q --no-install-recommends golang-go make >&2; }
  command -v etcd >/dev/null || { log "installing etcd-server"; as_root apt-get install -y -q --no-install-recommends etcd-server >&2; }
  local work=$CACHE/kubernetes/build
  rm -rf "$work" && mkdir -p "$work/lists/partial" "$work/src"
  local codename
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $(debian_mirror) $codename main" >"$work/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$work/lists" -o "Debug::NoLocking=1")
  log "fetching Debian's kubernetes $K8S_DEB source package"
  apt-get "${opts[@]}" -q update >&2
  (cd "$work/src" && apt-get "${opts[@]}" -q source --download-only "kubernetes=$K8S_DEB" >&2)
  local tarball
  tarball=$(ls "$work"/src/kubernetes_*.orig.tar.gz | head -1)
  [ -f "$tarball" ] || die "no kubernetes orig tarball was fetched"
  tar -C "$work/src" -xzf "$tarball"
  local tree
  tree=$(find "$work/src" -maxdepth 1 -type d -name 'kubernetes-*' | head -1)
  [ -d "$tree" ] || die "the tarball holds no kubernetes-* tree"
  log "building kube-apiserver (the tree's Makefile: code generators from vendor/, then the server; offline)"
  local t0=$SECONDS
  (cd "$tree" && GOPROXY=off GOFLAGS= CGO_ENABLED=0 GOCACHE="$work/gocache" KUBE_VERBOSE=0 \
    nice make WHAT=cmd/kube-apiserver >&2)
  mkdir -p "$(dirname "$BIN")"
  cp "$tree/_output/bin/kube-apiserver" "$BIN"
  log "built $BIN in $((SECONDS - t0)) s; removing the build tree"
  rm -rf "$work"
}

answers() { curl -skf --max-time 2 -H "Authorization: Bearer $TOKEN" "https://127.0.0.1:$PORT/readyz" >/dev/null 2>&1; }

print_env() {
  echo "GANTRY_TEST_KUBE_SERVER=https://127.0.0.1:$PORT"
  echo "GANTRY_TEST_KUBE_TOKEN=$TOKEN"
  echo "GANTRY_TEST_KUBE_CA=$D/certs/apiserver.crt"
}

start() {
  if answers; then print_env; return; fi
  build
  command -v etcd >/dev/null || as_root apt-get install -y -q --no-install-recommends etcd-server >&2
  stop_processes
  rm -rf "$D" && mkdir -p "$D/certs"
  openssl genrsa -out "$D/sa.key" 2048 2>/dev/null
  openssl rsa -in "$D/sa.key" -pubout -out "$D/sa.pub" 2>/dev/null
  echo "$TOKEN,gantry-test-admin,gantry-test-admin,system:masters" >"$D/tokens.csv"
  log "starting etcd on 127.0.0.1:$ETCD_PORT"
  ETCD_UNSUPPORTED_ARCH= etcd --data-dir "$D/etcd" --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT" >"$D/etcd.log" 2>&1 &
  echo $! >"$D/etcd.pid"
  log "starting kube-apiserver $K8S_VERSION on https://127.0.0.1:$PORT"
  # No controller-manager makes service-account tokens, so the ServiceAccount admission plugin
  # (which would refuse every pod) is off; Gantry's pods say automountServiceAccountToken: false
  # anyway.
  "$BIN" --etcd-servers="http://127.0.0.1:$ETCD_PORT" --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
    --secure-port="$PORT" --cert-dir="$D/certs" --token-auth-file="$D/tokens.csv" --authorization-mode=RBAC \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$D/sa.pub" \
    --service-account-signing-key-file="$D/sa.key" --service-cluster-ip-range=10.0.0.0/24 \
    --allow-privileged=true --disable-admission-plugins=ServiceAccount >"$D/apiserver.log" 2>&1 &
  echo $! >"$D/apiserver.pid"
  local i
  for i in $(seq 1 120); do
    answers && break
    kill -0 "$(cat "$D/apiserver.pid")" 2>/dev/null || { tail -20 "$D/apiserver.log" >&2; die "kube-apiserver exited"; }
    sleep 0.5
  done
  answers || { tail -20 "$D/apiserver.log" >&2; die "kube-apiserver is not ready after 60 s"; }
  log "ready"
  print_env
}

stop_processes() {
  local name pid
  for name in apiserver etcd; do
    [ -f "$D/$name.pid" ] || continue
    pid=$(cat "$D/$name.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$D/$name.pid"
  done
}

case "${1:-}" in
build) build ;;
start) start ;;
stop) stop_processes; rm -rf "$D" ;;
status) answers && print_env ;;
*) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
esac
