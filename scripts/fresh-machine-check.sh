#!/usr/bin/env bash
# Proof that a fresh machine needs nothing but the README's two commands: a new Debian 12 root
# (debootstrap, minbase: no compiler, no Python, no curl) with only rustup's toolchain copied in,
# a fresh clone of this repository's HEAD, and then, inside it,
#
#   1. scripts/run            builds and starts the embedded default; the step ends when a real
#                             model (smollm2-135m-instruct) answers a runsync request made with
#                             the key the first start printed, and the server is stopped;
#   2. scripts/test           the whole suite, as the README runs it.
#
# Each step's time goes to stdout and to $OUT/report.md. The root runs in a network namespace of
# its own (a veth pair with NAT to this machine's network), so it sees neither this machine's
# PostgreSQL, Redis nor Docker engine: what it uses, it installed and started itself. Run it as
# root; it takes over an hour on two cores (two full builds from nothing). CI does not run it.
#
#   scripts/fresh-machine-check.sh [--run-only] [--test-only] [--net-only] [--keep]
#     --run-only   step 1 only
#     --test-only  step 2 only (the steps are independent: each builds what it needs)
#     --net-only   makes the root and checks that it reaches Debian's mirror (apt-get update), only
#     --keep       leave the root in place afterwards (it is removed otherwise)
#
# Environment:
#   FRESH_DIR      where the root and the logs go          default /var/tmp/gantry-fresh
#   FRESH_MIRROR   Debian mirror                           default: read from apt's sources
#   FRESH_SUITE    Debian suite                            default bookworm
#   FRESH_REPO     the repository whose HEAD is cloned      default: the one holding this script
set -euo pipefail
ROOT="${FRESH_REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
DIR=${FRESH_DIR:-/var/tmp/gantry-fresh}
SUITE=${FRESH_SUITE:-bookworm}
RUN_ONLY=0
TEST_ONLY=0
NET_ONLY=0
KEEP=0
for arg in "$@"; do
  case "$arg" in
  --run-only) RUN_ONLY=1 ;;
  --test-only) TEST_ONLY=1 ;;
  --net-only) NET_ONLY=1 ;;
  --keep) KEEP=1 ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "run it as root (debootstrap, chroot, a network namespace)" >&2; exit 1; }

FS=$DIR/root
OUT=$DIR/out
NS=gantry-fresh
HOST_IF=gfresh0
NS_IF=gfresh1
NET=10.213.77
mkdir -p "$DIR"
rm -rf "$OUT"
mkdir -p "$OUT"
REPORT=$OUT/report.md
NOTES=$OUT/notes.md

say() { printf '[fresh %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
row() { printf '| %s | %s | %s |\n' "$1" "$2" "$3" | tee -a "$REPORT"; }
# step NAME CMD...: runs CMD, logs its output to $OUT/NAME.log, records its time and status.
step() {
  local name=$1 t0 status
  shift
  say "$name ..."
  t0=$(date +%s)
  set +e
  "$@" >"$OUT/$name.log" 2>&1 </dev/null
  status=$?
  set -e
  local secs=$(($(date +%s) - t0))
  row "$name" "$(printf '%dm %02ds' $((secs / 60)) $((secs % 60)))" "$([ $status = 0 ] && echo ok || echo "FAILED ($status)")"
  if [ $status != 0 ]; then
    tail -n 40 "$OUT/$name.log" >&2
    return $status
  fi
}

# Sends a signal to the root's processes whose command line has PATTERN (or all of them).
signal_in_root() {
  local sig=$1 pattern=${2:-} pid
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$FS" ] || continue
    [ -z "$pattern" ] || tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$pattern" || continue
    kill "-$sig" "$pid" 2>/dev/null || true
  done
}

mounted=()
forward_before=""
cleanup() {
  set +e
  # Whatever is still running in the root (the server, a daemon the tests started).
  signal_in_root KILL
  sleep 1
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null; done
  # Mounts the tests made inside (dockerd's) go too.
  grep -o " $FS/[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
  ip netns del "$NS" 2>/dev/null
  ip link del "$HOST_IF" 2>/dev/null
  iptables -t nat -D POSTROUTING -s "$NET.0/30" -j MASQUERADE 2>/dev/null
  iptables -D FORWARD -s "$NET.0/30" -j ACCEPT 2>/dev/null
  iptables -D FORWARD -d "$NET.0/30" -j ACCEPT 2>/dev/null
  [ -z "$forward_before" ] || sysctl -qw net.ipv4.ip_forward="$forward_before"
  if [ "$KEEP" = 0 ]; then rm -rf "$FS"; fi
}
trap cleanup EXIT

mirror() {
  if [ -n "${FRESH_MIRROR:-}" ]; then echo "$FRESH_MIRROR"; return; fi
  local m
  m=$(grep -hsE '^(URIs:|deb) ' /etc/apt/sources.list /etc/apt/sources.list.d/* |
    grep -v security | grep -oE 'https?://[^ ]+' | head -n1)
  echo "${m:-http://deb.debian.org/debian}"
}

command -v debootstrap >/dev/null || {
  say "installing debootstrap on this machine (to make the fresh root)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null </dev/null
}

{
  echo "# Fresh machine check, $(date -u +%Y-%m-%d)"
  echo
  echo "Commit $(git -C "$ROOT" rev-parse --short HEAD); host: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo);"
  echo "root: Debian $SUITE minbase from $(mirror), with rustup's stable toolchain copied in."
  echo
  echo "| step | time | result |"
  echo "|---|---:|---|"
} >"$REPORT"

# ---- the root: Debian minbase, rustup's toolchain, a fresh clone -----------------------------
rm -rf "$FS"
step debootstrap debootstrap --variant=minbase "$SUITE" "$FS" "$(mirror)"

copy_toolchain() {
  local home=${RUSTUP_HOME:-$HOME/.rustup} cargo_home=${CARGO_HOME:-$HOME/.cargo} tc
  tc=$(rustup default | awk '{print $1}')
  mkdir -p "$FS/root/.rustup/toolchains" "$FS/root/.cargo/bin"
  cp "$home/settings.toml" "$FS/root/.rustup/"
  cp -a "$home/toolchains/$tc" "$FS/root/.rustup/toolchains/"
  [ ! -d "$home/update-hashes" ] || cp -a "$home/update-hashes" "$FS/root/.rustup/"
  cp -a "$cargo_home/bin/." "$FS/root/.cargo/bin/"
  # What rustup's installer writes: ~/.cargo/env, sourced by the profile.
  cat >"$FS/root/.cargo/env" <<'ENV'
#!/bin/sh
case ":${PATH}:" in
*:"$HOME/.cargo/bin":*) ;;
*) export PATH="$HOME/.cargo/bin:$PATH" ;;
esac
ENV
  echo '. "$HOME/.cargo/env"' >>"$FS/root/.profile"
  echo "$tc: $(du -sh "$FS/root/.rustup" | cut -f1)"
}
step toolchain copy_toolchain
step clone git clone -q --no-local --no-hardlinks "$ROOT" "$FS/root/gantry"

# ---- its own network: a veth pair with NAT --------------------------------------------------
forward_before=$(sysctl -n net.ipv4.ip_forward)
ip netns add "$NS"
ip link add "$HOST_IF" type veth peer name "$NS_IF"
ip link set "$NS_IF" netns "$NS"
ip addr add "$NET.1/30" dev "$HOST_IF"
ip link set "$HOST_IF" up
ip netns exec "$NS" ip link set lo up
ip netns exec "$NS" ip addr add "$NET.2/30" dev "$NS_IF"
ip netns exec "$NS" ip link set "$NS_IF" up
ip netns exec "$NS" ip route add default via "$NET.1"
sysctl -qw net.ipv4.ip_forward=1
iptables -t nat -A POSTROUTING -s "$NET.0/30" -j MASQUERADE
iptables -I FORWARD -s "$NET.0/30" -j ACCEPT
iptables -I FORWARD -d "$NET.0/30" -j ACCEPT
cp /etc/resolv.conf "$FS/etc/resolv.conf"
# The certificate authorities this machine's network adds (a TLS-inspecting egress proxy, say)
# go where Debian's ca-certificates takes local ones from, so that the root's own bundle, made
# when scripts/run installs ca-certificates, trusts them too. Nothing else of this machine is
# copied in.
local_cas=(/usr/local/share/ca-certificates/*.crt)
ca_env=()
if [ -e "${local_cas[0]}" ]; then
  mkdir -p "$FS/usr/local/share/ca-certificates"
  cp "${local_cas[@]}" "$FS/usr/local/share/ca-certificates/"
  # npm and pip keep bundles of their own: pointed at the system's, as on this machine.
  ca_env=(NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt)
  echo "- this machine's local certificate authorities (its network's egress proxy) were copied into the root (${#local_cas[@]} files under /usr/local/share/ca-certificates), and npm and pip pointed at the system bundle" >>"$NOTES"
fi

mount_in() { mount "$@"; mounted+=("${!#}"); }
# The root is a mount point of its own, as a machine's / is: dockerd (run by scripts/test)
# remounts / while it unpacks an image, which fails on a directory that is not one
# ("remount /, flags: 0x84000: invalid argument").
mount_in --bind "$FS" "$FS"
mount_in --make-private "$FS"
mount_in -t proc proc "$FS/proc"
mount_in --rbind /sys "$FS/sys"
mount_in --make-rslave "$FS/sys"
mount_in --rbind /dev "$FS/dev"
mount_in --make-rslave "$FS/dev"
mount_in -t tmpfs tmpfs "$FS/run"

# A login shell as root in the root, in the namespace, with a clean environment: only what a
# fresh machine's shell has.
inside() {
  ip netns exec "$NS" chroot "$FS" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin CI=true "${ca_env[@]}" \
    /bin/bash -lc "$1"
}

finish() {
  if [ -s "$NOTES" ]; then { echo; cat "$NOTES"; } >>"$REPORT"; fi
  say "report: $REPORT"
  cat "$REPORT"
}

if [ "$NET_ONLY" = 1 ]; then
  step network inside 'apt-get update'
  finish
  exit 0
fi

# ---- 1. scripts/run ----------------------------------------------------------------------------
# Built and started; done when the text model answers with the printed key.
run_and_ask() {
  inside 'cd /root/gantry && exec scripts/run' >"$OUT/serve.log" 2>&1 </dev/null &
  local serve=$! key="" t0
  t0=$(date +%s)
  while kill -0 $serve 2>/dev/null; do
    key=$(grep -oE '(^|[[:space:]])gk_[A-Za-z0-9_-]+' "$OUT/serve.log" | head -n1 | tr -d '[:space:]' || true)
    [ -z "$key" ] || break
    sleep 5
  done
  [ -n "$key" ] || { echo "serve exited before printing a key"; tail -n 40 "$OUT/serve.log"; return 1; }
  echo "built and started, key printed after $(($(date +%s) - t0)) s"
  local answer=""
  for _ in $(seq 1 360); do
    answer=$(inside "curl -s -m 120 -H 'Authorization: Bearer $key' -H 'Content-Type: application/json' \
      -d '{\"input\":{\"messages\":[{\"role\":\"user\",\"content\":\"Say hello.\"}],\"max_tokens\":8}}' \
      http://127.0.0.1:8081/v2/smollm2-135m-instruct/runsync" 2>/dev/null || true)
    case "$answer" in *'"COMPLETED"'*) break ;; esac
    sleep 5
  done
  echo "runsync: $answer"
  signal_in_root TERM 'release/gantry'
  wait $serve || true
  case "$answer" in *'"COMPLETED"'*) echo "first answer after $(($(date +%s) - t0)) s" ;; *) return 1 ;; esac
}
if [ "$TEST_ONLY" = 0 ]; then
  step scripts-run run_and_ask
  grep -E '^(built and started|first answer)' "$OUT/scripts-run.log" | sed 's/^/- scripts\/run: /' >>"$NOTES" || true
fi

# ---- 2. scripts/test ---------------------------------------------------------------------------
if [ "$RUN_ONLY" = 0 ]; then
  status=0
  step scripts-test inside 'cd /root/gantry && scripts/test' || status=$?
  # The totals of every test binary, as .ci/run counts them.
  awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) } }
       END { printf "- scripts/test: %d passed, %d failed\n", p, f }' "$OUT/scripts-test.log" >>"$NOTES"
  [ $status = 0 ] || { finish; exit $status; }
fi
finish
