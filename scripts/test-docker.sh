#!/usr/bin/env bash
# A private Docker Engine for Gantry's runtime tests and CI.
#
#   bash scripts/test-docker.sh start    # install (if missing), start dockerd, import the test images;
#                                        # the last line printed is DOCKER_HOST=unix://.../docker.sock
#   bash scripts/test-docker.sh stop     # stop that dockerd and unmount what it left behind
#   bash scripts/test-docker.sh status   # DOCKER_HOST=... when it answers, exit 1 otherwise
#   bash scripts/test-docker.sh venv     # host venv with runpod-python; prints its python
#   bash scripts/test-docker.sh purge    # stop, then delete the state dir (the image cache stays)
#
# Why a private engine rather than the system one: tests must not depend on (or disturb) whatever the
# machine runs, and a daemon whose data root, exec root and socket all live under one directory can be
# thrown away without a trace. It runs with --iptables=false --bridge=none, i.e. host networking only,
# so it never touches the host's iptables rules or creates a docker0 bridge that would need cleaning up.
#
# Both images are built without any container registry: busybox comes from Debian's busybox-static,
# the RunPod base image from debootstrap (Debian mirror) plus pip (PyPI). The debootstrap tree is
# tarred once into the cache, so later runs (and CI with a warm cache) only `docker import` it. The
# worker image adds the handlers of scripts/runpod-handlers/ to it (a `docker build`, rebuilt when
# they change).
#
# Environment:
#   GANTRY_TEST_DOCKER_DIR  state dir (socket, data root, exec root, log)   default /tmp/gantry-test-docker
#   GANTRY_CACHE_DIR        image tarballs, host venv                        default $HOME/.cache/gantry
#   GANTRY_DEBIAN_MIRROR    Debian mirror for debootstrap                     default: read from apt's sources
#   GANTRY_TEST_DOCKER_IMAGES  `busybox`: import only the busybox image         default: all
#   GANTRY_TEST_DOCKER_FAKE_GPUS  1: a stand-in NVIDIA hook, so that GPU containers start (no GPUs)
#   GANTRY_TEST_DOCKER_BRIDGE  1: a default bridge network, on an interface this script makes
#                              (gantry-tb0, 172.31.251.1/24) and deletes at stop; still no iptables
#
# Progress goes to stderr; stdout carries only the result line, so `eval "$(... start | tail -1)"`
# or `export "$(... start | tail -1)"` works.
set -euo pipefail

D=${GANTRY_TEST_DOCKER_DIR:-/tmp/gantry-test-docker}
# The bridge of GANTRY_TEST_DOCKER_BRIDGE=1 (one such engine at a time).
BRIDGE_IF=gantry-tb0
BRIDGE_ADDR=172.31.251.1/24
CACHE=${GANTRY_CACHE_DIR:-${HOME:-/root}/.cache/gantry}
SOCK=$D/docker.sock
PIDFILE=$D/dockerd.pid
BUSYBOX_IMAGE=gantry-test/busybox:1
RUNPOD_BASE=gantry-test/runpod-base:1
RUNPOD_IMAGE=gantry-test/runpod-worker:1
RUNPOD_TAR=$CACHE/images/runpod-base-1.tar
RUNPOD_VERSION=1.12.0
VENV=$CACHE/venv-runpod
HANDLERS_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/runpod-handlers

log() { printf '[test-docker %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Runs "$@" and reports how long it took, so slow steps (debootstrap, pip) show up in CI logs.
timed() {
    local name=$1; shift
    local t0; t0=$(date +%s.%N)
    "$@"
    log "$name: $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f s", b-a}')"
}

need_root() { [ "$(id -u)" = 0 ] || die "'$1' needs root (it installs packages, runs dockerd and mounts)"; }

# The client talks to our daemon only, never to whatever DOCKER_HOST the caller had.
dk() { DOCKER_HOST=unix://$SOCK docker "$@"; }

ping_ok() { curl -sf --max-time 2 --unix-socket "$SOCK" http://localhost/_ping >/dev/null 2>&1; }

daemon_pid() {
    local pid
    [ -s "$PIDFILE" ] || return 1
    pid=$(cat "$PIDFILE")
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q dockerd "/proc/$pid/comm" 2>/dev/null || return 1
    echo "$pid"
}

# --- packages ------------------------------------------------------------------------------------

install_packages() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    [ -x /bin/busybox ] && dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v curl >/dev/null || missing+=(curl)
    command -v ip >/dev/null || missing+=(iproute2)
    if [ ${#missing[@]} -eq 0 ]; then
        log "packages present (dockerd $(dockerd --version 2>/dev/null | awk '{print $3}' | tr -d ,))"
        return
    fi
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Stale package lists 404 on the mirror, so refresh first; a failed refresh is not fatal if the
    # lists on disk still resolve.
    mkdir -p "$D"
    apt-get update -qq </dev/null >"$D/apt.log" 2>&1 || log "apt-get update failed; trying with the lists on disk"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >>"$D/apt.log" 2>&1 \
        || { tail -n 30 "$D/apt.log" >&2; die "apt-get install ${missing[*]} failed (log $D/apt.log)"; }
}

# --- dockerd -------------------------------------------------------------------------------------

start_daemon() {
    if daemon_pid >/dev/null && ping_ok; then
        log "dockerd already running (pid $(daemon_pid)) on $SOCK"
        return
    fi
    if pid=$(daemon_pid); then
        log "dockerd pid $pid exists but does not answer; stopping it first"
        stop_daemon
    fi
    rm -f "$PIDFILE" "$SOCK"
    mkdir -p "$D/data" "$D/exec"
    # An empty config file keeps a host /etc/docker/daemon.json (registry mirrors, cgroup driver, ...)
    # from leaking into the test engine.
    echo '{}' >"$D/daemon.json"
    local path=$PATH
    if [ "${GANTRY_TEST_DOCKER_FAKE_GPUS:-0}" = 1 ]; then
        # dockerd offers `--gpus` (DeviceRequests with the "nvidia" driver) when the NVIDIA
        # Container Toolkit's hook is on its PATH, and runs it as each such container's OCI
        # prestart hook. A hook that does nothing stands in for it: GPU containers start here,
        # without GPUs, so that the paths that ask for GPUs can be tested end to end.
        mkdir -p "$D/bin"
        printf '#!/bin/sh\n# A stand-in for the NVIDIA Container Toolkit hook (scripts/test-docker.sh).\ncat >/dev/null\nexit 0\n' \
            >"$D/bin/nvidia-container-runtime-hook"
        chmod +x "$D/bin/nvidia-container-runtime-hook"
        path="$D/bin:$PATH"
    fi
    local bridge=none
    if [ "${GANTRY_TEST_DOCKER_BRIDGE:-0}" = 1 ]; then
        # Containers on a bridge of the engine's own reach the host at the bridge's address (the
        # engine's `host-gateway`). The interface is made here, not by dockerd, so that its name
        # and address are known and nothing but it (no docker0, no iptables rules) needs cleaning up.
        bridge=$BRIDGE_IF
        if ! ip link show "$bridge" >/dev/null 2>&1; then
            ip link add "$bridge" type bridge
            ip addr add "$BRIDGE_ADDR" dev "$bridge"
        fi
        ip link set "$bridge" up
        echo "$bridge" >"$D/bridge"
    fi
    log "starting dockerd on $SOCK (log $D/dockerd.log)"
    # setsid: the daemon must outlive this script and the shell or CI step that ran it.
    # 9>&-: the daemon must not inherit the lock, or it would hold it for its whole life.
    PATH=$path setsid dockerd \
        --config-file "$D/daemon.json" \
        --data-root "$D/data" --exec-root "$D/exec" \
        -H "unix://$SOCK" --pidfile "$PIDFILE" \
        --iptables=false --bridge="$bridge" \
        >>"$D/dockerd.log" 2>&1 </dev/null 9>&- &
    local launcher=$!
    for _ in $(seq 1 120); do
        ping_ok && { log "dockerd answers /_ping (pid $(cat "$PIDFILE" 2>/dev/null || echo "$launcher"))"; return; }
        kill -0 "$launcher" 2>/dev/null || break
        sleep 0.5
    done
    log "dockerd did not answer /_ping on $SOCK; last lines of $D/dockerd.log:"
    tail -n 30 "$D/dockerd.log" >&2 || true
    die "dockerd failed to start"
}

# Processes started on behalf of this daemon (its managed containerd, the shims) carry the state dir
# in their command line; after a KILL they can survive the daemon, so they are found and ended by pid.
# Only engine processes count: a shell whose command line merely mentions the state dir (a CI step
# exporting DOCKER_HOST, say) must never be hit.
leftover_pids() {
    local p comm
    for p in /proc/[0-9]*; do
        comm=$(cat "$p/comm" 2>/dev/null) || continue
        case "$comm" in
        dockerd | containerd | containerd-shim* | runc | docker-proxy) ;;
        *) continue ;;
        esac
        tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF -- "$D/" && echo "${p#/proc/}"
    done
    return 0
}

unmount_leftovers() {
    local m
    # Deepest first; nsfs (network namespaces) under exec/netns and overlay under data/overlay2.
    awk -v d="$D/" 'index($2, d) == 1 {print length($2), $2}' /proc/self/mounts | sort -rn | cut -d' ' -f2- |
        while IFS= read -r m; do
            if umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; then
                log "unmounted $m"
            else
                log "could not unmount $m"
            fi
        done
}

stop_daemon() {
    local pid
    if pid=$(daemon_pid); then
        log "stopping dockerd pid $pid"
        kill -TERM "$pid" 2>/dev/null || true
        # dockerd gives running containers 15 s (its shutdown timeout) before it gives up on them.
        for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        if kill -0 "$pid" 2>/dev/null; then
            log "dockerd did not exit after TERM; sending KILL"
            kill -KILL "$pid" 2>/dev/null || true
            sleep 1
        fi
    else
        log "no dockerd running for $D"
    fi
    local left=()
    mapfile -t left < <(leftover_pids)
    if [ ${#left[@]} -gt 0 ]; then
        log "ending leftover processes: ${left[*]}"
        kill -TERM "${left[@]}" 2>/dev/null || true
        sleep 2
        mapfile -t left < <(leftover_pids)
        [ ${#left[@]} -eq 0 ] || kill -KILL "${left[@]}" 2>/dev/null || true
    fi
    unmount_leftovers
    if [ -s "$D/bridge" ]; then
        ip link del "$(cat "$D/bridge")" 2>/dev/null && log "deleted the bridge $(cat "$D/bridge")"
        rm -f "$D/bridge"
    fi
    rm -f "$PIDFILE" "$SOCK"
}

# --- images --------------------------------------------------------------------------------------

import_busybox() {
    if dk image inspect "$BUSYBOX_IMAGE" >/dev/null 2>&1; then
        log "$BUSYBOX_IMAGE present"
        return
    fi
    local root; root=$(mktemp -d "${TMPDIR:-/tmp}/gantry-busybox.XXXXXX")
    mkdir -p "$root/bin" "$root/etc" "$root/tmp" "$root/root" "$root/www"
    chmod 1777 "$root/tmp"
    cp /bin/busybox "$root/bin/busybox"
    local a
    # The applets the tests use, plus a few that make ad-hoc debugging bearable. No wget: the static
    # busybox's wget segfaults in bridge mode (static glibc NSS), so tests use nc instead.
    for a in sh echo sleep cat nc ls env httpd true false id printf date kill mkdir rm seq grep wc head tail \
        test '[' hostname uname pwd touch; do
        ln -s busybox "$root/bin/$a"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    tar -C "$root" --numeric-owner -cf - . | dk import -c 'CMD ["/bin/sh"]' - "$BUSYBOX_IMAGE" >/dev/null
    rm -rf "$root"
    log "imported $BUSYBOX_IMAGE"
}

# The first Debian archive URI whose suites include the bookworm release itself (not -security or
# -updates), from the one-line and deb822 source formats. Disabled files do not count.
debian_mirror() {
    if [ -n "${GANTRY_DEBIAN_MIRROR:-}" ]; then echo "$GANTRY_DEBIAN_MIRROR"; return; fi
    local f uri
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        uri=$(awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                   if ($(i+1) == "bookworm") { print $i; exit } }' "$f")
        [ -n "$uri" ] && { echo "$uri"; return; }
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        uri=$(awk 'function flush() { if (types ~ /(^| )deb( |$)/ && enabled != "no" && (" " suites " ") ~ / bookworm /) { split(uris, u, " "); print u[1]; done = 1 }
                                      types = ""; uris = ""; suites = ""; enabled = "" }
                   /^[ \t]*$/ { flush(); if (done) exit; next }
                   /^Types:/   { sub(/^Types:[ \t]*/, "");   types = $0 }
                   /^URIs:/    { sub(/^URIs:[ \t]*/, "");    uris = $0 }
                   /^Suites:/  { sub(/^Suites:[ \t]*/, "");  suites = $0 }
                   /^Enabled:/ { sub(/^Enabled:[ \t]*/, ""); enabled = tolower($0) }
                   END { if (!done) flush() }' "$f")
        [ -n "$uri" ] && { echo "$uri"; return; }
    done
    die "no bookworm Debian mirror in /etc/apt/sources.list{,.d}; set GANTRY_DEBIAN_MIRROR"
}

# pip inside the chroot must see the same index and trust the same CAs as pip on the host (this
# machine reaches PyPI through an egress proxy with its own CA). The host's bundle is copied in for the
# build only and removed afterwards, so the image carries no host-specific trust or configuration.
chroot_pip_env() {
    local root=$1 cert="" v
    # A setting naming a host path that the chroot lacks (this machine's PIP_FIND_LINKS=/opt/wheels)
    # would only make pip warn on every lookup, so such settings stay behind.
    while IFS= read -r v; do
        case "$v" in
        PIP_CERT=*) ;;
        *=/*) [ -e "$root/${v#*=}" ] && echo "$v" ;;
        *) echo "$v" ;;
        esac
    done < <(env | grep -E '^PIP_[A-Z_]+=' || true)
    cert=${PIP_CERT:-}
    if [ -z "$cert" ] && [ -f /etc/pip.conf ]; then
        cert=$(awk -F= '/^[ \t]*cert[ \t]*=/ {v = $2; gsub(/^[ \t]+|[ \t]+$/, "", v); print v; exit}' /etc/pip.conf)
    fi
    [ -n "$cert" ] || cert=/etc/ssl/certs/ca-certificates.crt
    if [ -f "$cert" ]; then
        cp "$cert" "$root/tmp/gantry-build-ca.crt"
        echo "PIP_CERT=/tmp/gantry-build-ca.crt"
    fi
    for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
        [ -n "${!v:-}" ] && echo "$v=${!v}"
    done
    return 0
}

run_debootstrap() {
    local root=$1 mirror=$2
    shift 2
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$@" bookworm "$root" "$mirror" \
        >"$D/debootstrap.log" 2>&1 \
        || { tail -n 30 "$D/debootstrap.log" >&2; die "debootstrap failed (log $D/debootstrap.log)"; }
}

build_runpod_rootfs() {
    local root=$1 mirror keyring=()
    mirror=$(debian_mirror)
    [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] && keyring=(--keyring=/usr/share/keyrings/debian-archive-keyring.gpg)
    log "debootstrap bookworm (minbase) from $mirror"
    timed "debootstrap" run_debootstrap "$root" "$mirror" "${keyring[@]}"

    [ -f /etc/pip.conf ] && cp /etc/pip.conf "$root/etc/pip.conf"
    cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    local envs; mapfile -t envs < <(chroot_pip_env "$root")

    mount -t proc proc "$root/proc"
    mount --bind /dev "$root/dev"
    # shellcheck disable=SC2064 # expand $root now: it is local and gone when the trap fires
    trap "umount '$root/dev' 2>/dev/null; umount '$root/proc' 2>/dev/null" EXIT
    log "pip install runpod==$RUNPOD_VERSION in the chroot"
    timed "venv + pip install (chroot)" chroot "$root" /usr/bin/env -i \
        PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 "${envs[@]}" \
        /bin/sh -c "python3 -m venv /opt/venv && /opt/venv/bin/pip install -q --no-cache-dir runpod==$RUNPOD_VERSION \
                    && /opt/venv/bin/python -c 'import runpod; print(\"runpod\", runpod.__version__)'" >&2
    umount "$root/dev"
    umount "$root/proc"
    trap - EXIT

    # Build-time only: host pip config and CA, package caches.
    rm -f "$root/etc/pip.conf" "$root/tmp/gantry-build-ca.crt"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/root/.cache
}

# Never recurse into a mount: if /dev were still bound into the tree, a plain rm -rf would empty the host's.
remove_rootfs() {
    local root=$1
    if awk -v d="$root/" 'index($2, d) == 1 {found = 1} END {exit !found}' /proc/self/mounts; then
        die "$root still has mounts under it; not removing it"
    fi
    rm -rf --one-file-system "$root"
}

import_runpod() {
    if dk image inspect "$RUNPOD_BASE" >/dev/null 2>&1; then
        log "$RUNPOD_BASE present"
        return
    fi
    if [ ! -s "$RUNPOD_TAR" ]; then
        log "no cached rootfs at $RUNPOD_TAR; building it (a few minutes, once)"
        mkdir -p "$CACHE/images"
        local root; root=$(mktemp -d "$CACHE/images/rootfs.XXXXXX")
        build_runpod_rootfs "$root"
        timed "tar rootfs" tar -C "$root" --numeric-owner -cf "$RUNPOD_TAR.part" .
        mv "$RUNPOD_TAR.part" "$RUNPOD_TAR"
        remove_rootfs "$root"
        log "cached $(du -h "$RUNPOD_TAR" | cut -f1) at $RUNPOD_TAR"
    fi
    timed "docker import $RUNPOD_BASE" dk import \
        -c 'ENV PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin' \
        "$RUNPOD_TAR" "$RUNPOD_BASE" >/dev/null
}

# The test handlers (scripts/runpod-handlers, in the repository) on top of the
# base image; built again whenever they change (the image is labelled with
# their digest).
build_runpod_worker() {
    local digest current ctx
    digest=$(cat "$HANDLERS_SRC"/*.py | sha256sum | cut -c1-16)
    current=$(dk image inspect -f '{{ index .Config.Labels "gantry.handlers" }}' "$RUNPOD_IMAGE" 2>/dev/null || true)
    if [ "$current" = "$digest" ]; then
        log "$RUNPOD_IMAGE present (handlers $digest)"
        return
    fi
    ctx=$(mktemp -d)
    cp "$HANDLERS_SRC"/*.py "$ctx/"
    cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM $RUNPOD_BASE
COPY *.py /opt/handlers/
LABEL gantry.handlers=$digest
CMD ["/opt/venv/bin/python", "-u", "/opt/handlers/echo.py"]
DOCKERFILE
    timed "docker build $RUNPOD_IMAGE" env DOCKER_BUILDKIT=0 docker -H "unix://$D/docker.sock" build -q -t "$RUNPOD_IMAGE" "$ctx" >/dev/null
    rm -rf "$ctx"
}

# --- host venv -----------------------------------------------------------------------------------

make_venv() {
    if "$VENV/bin/python" -c "import runpod, sys; sys.exit(runpod.__version__ != '$RUNPOD_VERSION')" 2>/dev/null; then
        log "venv with runpod $RUNPOD_VERSION present at $VENV"
    else
        rm -rf "$VENV"
        mkdir -p "$CACHE"
        timed "host venv + pip install" sh -c "python3 -m venv '$VENV' && '$VENV/bin/pip' install -q runpod==$RUNPOD_VERSION >&2"
        log "venv at $VENV"
    fi
    echo "$VENV/bin/python"
}

# --- commands ------------------------------------------------------------------------------------

lock() {
    mkdir -p "$D"
    exec 9>"$D/.lock"
    flock -w 900 9 || die "another test-docker.sh holds $D/.lock"
}

cmd=${1:-}
case "$cmd" in
start)
    need_root start
    lock
    timed "packages" install_packages
    timed "dockerd" start_daemon
    timed "$BUSYBOX_IMAGE" import_busybox
    if [ "${GANTRY_TEST_DOCKER_IMAGES:-all}" != busybox ]; then
        timed "$RUNPOD_BASE" import_runpod
        timed "$RUNPOD_IMAGE" build_runpod_worker
    fi
    echo "DOCKER_HOST=unix://$SOCK"
    ;;
stop)
    need_root stop
    lock
    timed "stop" stop_daemon
    ;;
purge)
    need_root purge
    lock
    stop_daemon
    rm -rf --one-file-system "$D"
    log "removed $D (cache $CACHE kept)"
    ;;
status)
    if daemon_pid >/dev/null && ping_ok; then echo "DOCKER_HOST=unix://$SOCK"; else log "not running"; exit 1; fi
    ;;
venv)
    make_venv
    ;;
*)
    echo "usage: $0 start|stop|status|venv|purge" >&2
    exit 2
    ;;
esac
