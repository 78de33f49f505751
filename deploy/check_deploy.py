#!/usr/bin/env python3
"""Offline checks of Gantry's deployment artifacts, run by deploy/validate.sh.

Subcommands (each prints what it checked and exits 1 on any problem):

  k8s FILE --target NAME [--versions 1.30 ...] [--external-secret NAME ...]
      A kustomize rendering: every object against the Kubernetes JSON schemas
      of each version (kubernetes-validate, strict: unknown fields are errors),
      custom resources against deploy/kubernetes/schemas/, then the references
      between objects that no schema sees (selectors, ports, Secrets, ...).
  compose FILE
      The output of `docker compose config`: mounts, scaling, workers.
  observability
      deploy/compose: Prometheus, OpenTelemetry collector, Grafana, nginx.
  promql FILE
      Writes every PromQL expression of the dashboards and autoscalers as a
      Prometheus rules file, for `promtool check rules`.
  dockerfile
      deploy/Dockerfile: stages of both variants, the runtime image.

Needs PyYAML, jsonschema and kubernetes-validate (validate.sh installs them).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SCHEMAS = DEPLOY / "kubernetes" / "schemas"
COMPOSE_DIR = DEPLOY / "compose"

# The longest a job runs by default (executionTimeout, docs/scheduler.md); a
# worker's drain must be given at least that, plus time to report.
DEFAULT_EXECUTION_TIMEOUT_S = 600
DRAIN_MARGIN_S = 30

CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
    "PersistentVolume", "StorageClass", "PriorityClass", "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration", "ClusterTriggerAuthentication",
}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}


class Report:
    def __init__(self, title: str):
        self.title = title
        self.errors: list[str] = []
        self.notes: list[str] = []

    def error(self, message: str) -> None:
        self.errors.append(message)

    def note(self, message: str) -> None:
        self.notes.append(message)

    def finish(self, summary: str) -> int:
        for note in self.notes:
            print(f"  note: {note}")
        for err in self.errors:
            print(f"  ERROR: {err}")
        status = "ok" if not self.errors else f"{len(self.errors)} error(s)"
        print(f"{self.title}: {summary}: {status}")
        return 1 if self.errors else 0


def ident(obj: dict) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def labels_match(selector: dict | None, labels: dict) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against labels."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


# ---- Kubernetes ------------------------------------------------------------------------------

def schema_validate(docs: list[dict], versions: list[str], report: Report) -> tuple[int, int]:
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError

    builtin = custom = 0
    for obj in docs:
        try:
            for version in versions:
                try:
                    kubernetes_validate.validate(obj, version, strict=True)
                except jsonschema.ValidationError as err:
                    path = "/".join(str(p) for p in err.absolute_path) or "(top)"
                    report.error(f"{ident(obj)}: Kubernetes {version} schema: at {path}: {err.message}")
                    break
            builtin += 1
        except SchemaNotFoundError:
            group_version = obj["apiVersion"].replace("/", "-")
            schema_file = SCHEMAS / f"{obj['kind'].lower()}-{group_version}.json"
            if not schema_file.exists():
                report.error(
                    f"{ident(obj)} ({obj['apiVersion']}): not a Kubernetes kind and no schema in "
                    f"{schema_file.relative_to(ROOT)}: write one"
                )
                continue
            schema = json.loads(schema_file.read_text())
            validator = jsonschema.Draft202012Validator(schema)
            problems = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
            for err in problems:
                path = "/".join(str(p) for p in err.absolute_path) or "(top)"
                report.error(f"{ident(obj)}: {schema_file.name}: at {path}: {err.message}")
            custom += 1
    return builtin, custom


def runtime_pods(selector: dict) -> bool:
    """Whether a selector picks pods that Gantry's fleet makes at run time (label gantry.kind)."""
    return "gantry.kind" in (selector.get("matchLabels") or {})


def pod_templates(docs: list[dict]) -> list[tuple[dict, dict]]:
    """(workload, pod template) of every workload."""
    out = []
    for obj in docs:
        if obj["kind"] in WORKLOADS:
            out.append((obj, obj["spec"]["template"]))
    return out


def containers_of(pod_spec: dict) -> list[dict]:
    return list(pod_spec.get("initContainers") or []) + list(pod_spec.get("containers") or [])


def check_references(docs: list[dict], external_secrets: set[str], report: Report) -> None:
    by_kind: dict[tuple[str, str], dict] = {}
    namespaces = [o["metadata"]["name"] for o in docs if o["kind"] == "Namespace"]
    for obj in docs:
        key = (obj["kind"], obj["metadata"]["name"])
        if key in by_kind:
            report.error(f"{ident(obj)} appears twice")
        by_kind[key] = obj
        if obj["kind"] not in CLUSTER_SCOPED:
            ns = obj["metadata"].get("namespace")
            if not ns:
                report.error(f"{ident(obj)} has no namespace (set `namespace:` in the overlay)")
            elif namespaces and ns not in namespaces:
                report.error(f"{ident(obj)} is in namespace {ns}, which the rendering does not create")

    def data_keys(kind: str, name: str) -> set[str] | None:
        obj = by_kind.get((kind, name))
        if obj is None:
            return None
        keys = set((obj.get("data") or {}).keys()) | set((obj.get("stringData") or {}).keys())
        return keys

    def check_ref(owner: str, kind: str, name: str, key: str | None, optional: bool) -> None:
        keys = data_keys(kind, name)
        if keys is None:
            if kind == "Secret" and name in external_secrets:
                return
            if optional:
                return
            report.error(f"{owner}: {kind} {name} is not in the rendering")
            return
        if key is not None and key not in keys and not optional:
            report.error(f"{owner}: {kind} {name} has no key {key!r} (has: {', '.join(sorted(keys))})")

    restricted = {
        o["metadata"]["name"]
        for o in docs
        if o["kind"] == "Namespace"
        and (o["metadata"].get("labels") or {}).get("pod-security.kubernetes.io/enforce") == "restricted"
    }
    templates = pod_templates(docs)

    for workload, template in templates:
        wid = ident(workload)
        spec = template["spec"]
        labels = (template.get("metadata") or {}).get("labels") or {}
        if workload["kind"] != "Job":
            if not labels_match(workload["spec"].get("selector"), labels):
                report.error(f"{wid}: spec.selector does not match its pod template's labels")
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        for vol in volumes.values():
            if "configMap" in vol:
                check_ref(wid, "ConfigMap", vol["configMap"]["name"], None, vol["configMap"].get("optional", False))
            if "secret" in vol:
                check_ref(wid, "Secret", vol["secret"]["secretName"], None, vol["secret"].get("optional", False))
            if "persistentVolumeClaim" in vol:
                claim = vol["persistentVolumeClaim"]["claimName"]
                if ("PersistentVolumeClaim", claim) not in by_kind:
                    report.error(f"{wid}: PersistentVolumeClaim {claim} is not in the rendering")
        sa = spec.get("serviceAccountName")
        if sa and ("ServiceAccount", sa) not in by_kind:
            report.error(f"{wid}: ServiceAccount {sa} is not in the rendering")
        in_restricted = workload["metadata"].get("namespace") in restricted
        pod_sc = spec.get("securityContext") or {}
        for c in containers_of(spec):
            cid = f"{wid} container {c['name']}"
            image = c.get("image", "")
            last = image.rsplit("/", 1)[-1]
            if ":" not in last and "@" not in last:
                report.error(f"{cid}: image {image!r} has no tag (set one with kustomize `images:`)")
            for src in c.get("envFrom") or []:
                if "configMapRef" in src:
                    check_ref(cid, "ConfigMap", src["configMapRef"]["name"], None, src["configMapRef"].get("optional", False))
                if "secretRef" in src:
                    check_ref(cid, "Secret", src["secretRef"]["name"], None, src["secretRef"].get("optional", False))
            env_names = set()
            for env in c.get("env") or []:
                if env["name"] in env_names:
                    report.error(f"{cid}: env {env['name']} is set twice")
                env_names.add(env["name"])
                ref = env.get("valueFrom") or {}
                if "configMapKeyRef" in ref:
                    r = ref["configMapKeyRef"]
                    check_ref(cid, "ConfigMap", r["name"], r["key"], r.get("optional", False))
                if "secretKeyRef" in ref:
                    s = ref["secretKeyRef"]
                    check_ref(cid, "Secret", s["name"], s["key"], s.get("optional", False))
            # $(VAR) in args must name an env var of the container.
            for arg in (c.get("args") or []) + (c.get("command") or []):
                for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg):
                    if var not in env_names:
                        report.error(f"{cid}: argument {arg!r} uses $({var}), which the container does not define")
            port_names = {p.get("name") for p in c.get("ports") or [] if p.get("name")}
            for probe_name in ("startupProbe", "livenessProbe", "readinessProbe"):
                probe = c.get(probe_name)
                if not probe:
                    continue
                for handler in ("httpGet", "tcpSocket", "grpc"):
                    port = (probe.get(handler) or {}).get("port")
                    if isinstance(port, str) and port not in port_names:
                        report.error(f"{cid}: {probe_name} uses port {port!r}, which the container does not name")
            for mount in c.get("volumeMounts") or []:
                if mount["name"] not in volumes:
                    report.error(f"{cid}: mounts volume {mount['name']!r}, which the pod does not define")
            res = c.get("resources") or {}
            if not (res.get("requests") or {}).get("cpu") or not (res.get("requests") or {}).get("memory"):
                report.error(f"{cid}: no cpu and memory requests")
            if not (res.get("limits") or {}).get("memory"):
                report.error(f"{cid}: no memory limit")
            if in_restricted:
                sc = c.get("securityContext") or {}
                if not (sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))):
                    report.error(f"{cid}: runAsNonRoot is not set (the namespace enforces the restricted profile)")
                if sc.get("allowPrivilegeEscalation") is not False:
                    report.error(f"{cid}: allowPrivilegeEscalation must be false (restricted profile)")
                if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                    report.error(f"{cid}: capabilities must drop ALL (restricted profile)")
                seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
                if seccomp not in ("RuntimeDefault", "Localhost"):
                    report.error(f"{cid}: seccompProfile must be RuntimeDefault (restricted profile)")

        # Gantry's roles.
        gantry_services = [o["metadata"]["name"] for o in docs if o["kind"] == "Service" and o["metadata"]["name"].startswith("gantry-")]
        if labels.get("app.kubernetes.io/name") == "gantry" and gantry_services and spec.get("enableServiceLinks", True):
            report.error(
                f"{wid}: set enableServiceLinks: false; Service {gantry_services[0]} injects "
                f"{gantry_services[0].upper().replace('-', '_')}_PORT..., which Gantry reads as settings (GANTRY_*)"
            )
        component = labels.get("app.kubernetes.io/component")
        main = (spec.get("containers") or [{}])[0]
        args = main.get("args") or []
        if component == "worker":
            grace = spec.get("terminationGracePeriodSeconds", 30)
            if grace < DEFAULT_EXECUTION_TIMEOUT_S + DRAIN_MARGIN_S:
                report.error(
                    f"{wid}: terminationGracePeriodSeconds {grace} < {DEFAULT_EXECUTION_TIMEOUT_S + DRAIN_MARGIN_S}: "
                    "a draining worker would be killed before its jobs can finish"
                )
            if not re.search(r"--id[= ]\S*\$\(", " ".join(args)):
                report.error(f"{wid}: a worker needs a unique --id per pod (e.g. --id=$(POD_NAME)); the default repeats across pods")
            if not any(a.startswith("--scheduler") for a in args):
                report.error(f"{wid}: a worker needs --scheduler")
            if "gantry.dev/model" not in labels:
                report.error(f"{wid}: a worker pod needs the label gantry.dev/model")
            model = next((a.split("=", 1)[1] for a in args if a.startswith("--model=")), None)
            if model and labels.get("gantry.dev/model") != model:
                report.error(f"{wid}: label gantry.dev/model={labels.get('gantry.dev/model')} but it serves {model}")
        if component == "api":
            if not main.get("readinessProbe") or not main.get("livenessProbe"):
                report.error(f"{wid}: the api needs readiness (/readyz) and liveness (/healthz) probes")
            if not ((main.get("lifecycle") or {}).get("preStop")):
                report.error(f"{wid}: the api needs a preStop delay so readiness drops before the listeners close")

    def pods_selected(selector_labels: dict | None, namespace: str | None, as_selector: dict | None = None):
        sel = as_selector if as_selector is not None else {"matchLabels": selector_labels or {}}
        return [
            (w, t) for w, t in templates
            if w["metadata"].get("namespace") == namespace
            and labels_match(sel, (t.get("metadata") or {}).get("labels") or {})
        ]

    def named_ports(matched) -> set[str]:
        return {
            p["name"] for _, t in matched for c in t["spec"].get("containers") or []
            for p in c.get("ports") or [] if p.get("name")
        }

    deployments = {o["metadata"]["name"]: o for o in docs if o["kind"] == "Deployment"}
    for obj in docs:
        oid, ns, spec = ident(obj), obj["metadata"].get("namespace"), obj.get("spec") or {}
        if obj["kind"] == "Service" and spec.get("selector"):
            matched = pods_selected(spec["selector"], ns)
            if not matched:
                report.error(f"{oid}: its selector matches no pod template")
            for port in spec.get("ports") or []:
                target = port.get("targetPort")
                if isinstance(target, str) and target not in named_ports(matched):
                    report.error(f"{oid}: targetPort {target!r} is not a port name of the pods it selects")
        if obj["kind"] == "PodDisruptionBudget":
            matched = pods_selected(None, ns, spec.get("selector"))
            if not matched:
                report.error(f"{oid}: its selector matches no pod template")
            min_available = spec.get("minAvailable")
            for w, _ in matched:
                replicas = w["spec"].get("replicas")
                if isinstance(min_available, int) and isinstance(replicas, int) and min_available >= replicas:
                    report.error(f"{oid}: minAvailable {min_available} >= {ident(w)} replicas {replicas}: no pod could ever be evicted")
        if obj["kind"] == "NetworkPolicy":
            selector = spec.get("podSelector") or {}
            # Pods labelled gantry.kind are the ones Gantry's fleet makes at run time (serverless
            # workers, users' pods): not part of the rendering.
            if selector and runtime_pods(selector):
                matched = []
            elif selector:
                matched = pods_selected(None, ns, selector)
                if not matched:
                    report.error(f"{oid}: its podSelector matches no pod template")
            else:
                matched = [(w, t) for w, t in templates if w["metadata"].get("namespace") == ns]
            ports = named_ports(matched)
            for rule in spec.get("ingress") or []:
                for port in rule.get("ports") or []:
                    if isinstance(port.get("port"), str) and port["port"] not in ports:
                        report.error(f"{oid}: ingress port {port['port']!r} is not a port name of the pods it selects")
            for direction in ("ingress", "egress"):
                for rule in spec.get(direction) or []:
                    for peer in rule.get("from" if direction == "ingress" else "to") or []:
                        if "podSelector" in peer and "namespaceSelector" not in peer and peer["podSelector"]:
                            # Operators' pods are not part of the rendering.
                            is_operator = "gantry.dev/operator" in (peer["podSelector"].get("matchLabels") or {})
                            if (not is_operator and not runtime_pods(peer["podSelector"])
                                    and not pods_selected(None, ns, peer["podSelector"])):
                                report.error(f"{oid}: a {direction} peer's podSelector matches no pod template")
        if obj["kind"] == "PodMonitor":
            matched = pods_selected(None, ns, spec.get("selector"))
            if not matched:
                report.error(f"{oid}: its selector matches no pod template")
            for ep in spec.get("podMetricsEndpoints") or []:
                if ep.get("port") and ep["port"] not in named_ports(matched):
                    report.error(f"{oid}: port {ep['port']!r} is not a port name of the pods it selects")

    # Autoscalers: an existing target, one autoscaler per target, the right model.
    scaled: dict[str, str] = {}
    for obj in docs:
        if obj["kind"] not in ("ScaledObject", "HorizontalPodAutoscaler"):
            continue
        oid, spec = ident(obj), obj["spec"]
        target = spec["scaleTargetRef"]
        if target.get("kind", "Deployment") != "Deployment" or target["name"] not in deployments:
            report.error(f"{oid}: scale target {target.get('kind', 'Deployment')}/{target['name']} is not in the rendering")
            continue
        if target["name"] in scaled:
            report.error(f"{oid} and {scaled[target['name']]} both scale Deployment/{target['name']}: use one of components/keda, components/hpa")
        scaled[target["name"]] = oid
        deployment = deployments[target["name"]]
        if "replicas" in deployment["spec"]:
            report.error(f"{oid}: Deployment/{target['name']} sets spec.replicas, which every apply would reset under the autoscaler")
        model = (deployment["spec"]["template"]["metadata"].get("labels") or {}).get("gantry.dev/model")
        if obj["kind"] == "ScaledObject":
            for trig in spec["triggers"]:
                query = (trig.get("metadata") or {}).get("query", "")
                if trig["type"] == "prometheus" and f'model="{model}"' not in query:
                    report.error(f"{oid}: its query {query!r} is not about model {model!r}, which the target serves")
        else:
            for metric in spec.get("metrics") or []:
                sel = ((metric.get("external") or {}).get("metric") or {}).get("selector") or {}
                if (sel.get("matchLabels") or {}).get("model") != model:
                    report.error(f"{oid}: its metric selector is not about model {model!r}, which the target serves")
    for name, d in deployments.items():
        labels = d["spec"]["template"]["metadata"].get("labels") or {}
        if labels.get("app.kubernetes.io/component") == "worker" and "replicas" not in d["spec"] and name not in scaled:
            report.error(f"Deployment/{name}: no spec.replicas and no autoscaler")


def cmd_k8s(args: argparse.Namespace) -> int:
    report = Report(f"kubernetes {args.target}")
    docs = [d for d in yaml.safe_load_all(Path(args.file).read_text()) if d]
    if not docs:
        report.error("the rendering is empty")
        return report.finish("0 objects")
    builtin, custom = schema_validate(docs, args.versions, report)
    check_references(docs, set(args.external_secret), report)
    for name in sorted(set(args.external_secret)):
        if any(
            o["kind"] in WORKLOADS and name in json.dumps(o) for o in docs
        ) and ("Secret", name) not in {(o["kind"], o["metadata"]["name"]) for o in docs}:
            report.note(f"Secret {name} is external: it must exist in the cluster before the pods start")
    kinds: dict[str, int] = {}
    for d in docs:
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    summary = (
        f"{len(docs)} objects ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}); "
        f"{builtin} against the Kubernetes {'/'.join(args.versions)} schemas, {custom} against deploy/kubernetes/schemas"
    )
    return report.finish(summary)


# ---- Compose ---------------------------------------------------------------------------------

def duration_s(value) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    total = 0.0
    for amount, unit in re.findall(r"([0-9.]+)(ms|us|h|m|s)", str(value)):
        total += float(amount) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}[unit]
    return total


def compose_mounts(service: dict) -> list[tuple[str, str, str]]:
    """(type, source, target) of each mount, in either output format of `config`."""
    out = []
    for vol in service.get("volumes") or []:
        if isinstance(vol, str):
            parts = vol.split(":")
            source, target = (parts[0], parts[1]) if len(parts) > 1 else ("", parts[0])
            kind = "bind" if source.startswith(("/", ".", "~")) else "volume"
            out.append((kind, source, target))
        else:
            out.append((vol.get("type", "volume"), vol.get("source", ""), vol.get("target", "")))
    return out


def cmd_compose(args: argparse.Namespace) -> int:
    report = Report("compose")
    config = yaml.safe_load(Path(args.file).read_text())
    services = config.get("services") or {}
    volumes = set((config.get("volumes") or {}).keys())
    gantry_images = set()
    for name, svc in services.items():
        for kind, source, target in compose_mounts(svc):
            if kind == "bind" and not Path(source).exists():
                report.error(f"{name}: bind mount {source} does not exist")
            if kind == "volume" and source and source not in volumes:
                report.error(f"{name}: volume {source} is not declared")
        replicas = ((svc.get("deploy") or {}).get("replicas")) or svc.get("scale") or 1
        ports = svc.get("ports") or []
        if int(replicas) > 1:
            for port in ports:
                published = port.get("published") if isinstance(port, dict) else str(port).rsplit(":", 1)[0]
                if published and "-" not in str(published):
                    report.error(f"{name}: {replicas} replicas cannot share the fixed host port {published}")
        build = svc.get("build")
        if build:
            dockerfile = Path(build.get("context", ".")) / build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else None
            if dockerfile and not dockerfile.exists():
                report.error(f"{name}: build file {dockerfile} does not exist")
            gantry_images.add(svc.get("image"))
        for dep in (svc.get("depends_on") or {}):
            if dep not in services:
                report.error(f"{name}: depends on {dep}, which is not a service")
        entry = svc.get("entrypoint") or []
        script = " ".join(entry) if isinstance(entry, list) else str(entry)
        if "gantry worker" in script:
            if "exec gantry" not in script:
                report.error(f"{name}: the worker must be exec'd so that it gets SIGTERM and drains")
            if "--id" not in script or "HOSTNAME" not in script:
                report.error(f"{name}: workers need a unique --id per container (its host name) to be scaled")
            grace = duration_s(svc.get("stop_grace_period", "10s"))
            if grace < DEFAULT_EXECUTION_TIMEOUT_S + DRAIN_MARGIN_S:
                report.error(f"{name}: stop_grace_period {grace:.0f}s is shorter than a drain ({DEFAULT_EXECUTION_TIMEOUT_S + DRAIN_MARGIN_S}s)")
    if len(gantry_images) != 1:
        report.error(f"the gantry services should share one image built from deploy/Dockerfile, found {sorted(map(str, gantry_images))}")
    # Prometheus must scrape services that exist.
    prometheus = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    for job in prometheus.get("scrape_configs") or []:
        hosts = [n for sd in job.get("dns_sd_configs") or [] for n in sd.get("names") or []]
        hosts += [t.rsplit(":", 1)[0] for sc in job.get("static_configs") or [] for t in sc.get("targets") or []]
        for host in hosts:
            if host != "localhost" and host not in services:
                report.error(f"prometheus.yml job {job['job_name']}: {host} is not a compose service")
    return report.finish(f"{len(services)} services, {len(volumes)} volumes")


# ---- Observability configs -------------------------------------------------------------------

REQUIRED_DASHBOARD_METRICS = [
    "gantry_queue_depth", "gantry_queue_oldest_age_seconds", "gantry_job_execution_seconds_bucket",
    "gantry_job_delay_seconds_bucket", 'gantry_units_produced_total{unit="tokens"', 'gantry_http_requests_total{status=~"5.."}',
]


def dashboard_exprs(dashboard: dict) -> list[tuple[str, str]]:
    out = []
    for panel in dashboard.get("panels") or []:
        for target in panel.get("targets") or []:
            out.append((panel.get("title", "?"), target.get("expr", "")))
        for inner in panel.get("panels") or []:
            for target in inner.get("targets") or []:
                out.append((inner.get("title", "?"), target.get("expr", "")))
    return out


def cmd_observability(args: argparse.Namespace) -> int:
    report = Report("observability configs")
    # OpenTelemetry collector: every component a pipeline names is defined.
    otel = yaml.safe_load((COMPOSE_DIR / "otel-collector.yaml").read_text())
    service = otel.get("service") or {}
    for ext in service.get("extensions") or []:
        if ext not in (otel.get("extensions") or {}):
            report.error(f"otel-collector.yaml: extension {ext} is not defined")
    for name, pipeline in (service.get("pipelines") or {}).items():
        for section in ("receivers", "processors", "exporters"):
            for component in pipeline.get(section) or []:
                if component not in (otel.get(section) or {}):
                    report.error(f"otel-collector.yaml: pipeline {name} uses {section[:-1]} {component}, which is not defined")
    protocols = ((otel.get("receivers") or {}).get("otlp") or {}).get("protocols") or {}
    for proto in ("grpc", "http"):
        endpoint = (protocols.get(proto) or {}).get("endpoint", "")
        if not endpoint.startswith("0.0.0.0:"):
            report.error(f"otel-collector.yaml: the OTLP {proto} receiver must listen on 0.0.0.0 (the default is localhost)")
    # Grafana: datasource and dashboards provisioning, the dashboard itself.
    ds = yaml.safe_load((COMPOSE_DIR / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    uids = {d.get("uid") for d in ds.get("datasources") or []}
    providers = yaml.safe_load((COMPOSE_DIR / "grafana/provisioning/dashboards/gantry.yaml").read_text())
    for provider in providers.get("providers") or []:
        if (provider.get("options") or {}).get("path") != "/etc/grafana/dashboards":
            report.error("grafana dashboards provider: path must be /etc/grafana/dashboards (the compose mount)")
    dashboards = sorted((COMPOSE_DIR / "grafana/dashboards").glob("*.json"))
    if not dashboards:
        report.error("no dashboard in deploy/compose/grafana/dashboards")
    for path in dashboards:
        try:
            dashboard = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            report.error(f"{path.name}: not JSON: {err}")
            continue
        ids = [p.get("id") for p in dashboard.get("panels") or []]
        if len(ids) != len(set(ids)):
            report.error(f"{path.name}: panel ids repeat")
        variables = {v["name"] for v in (dashboard.get("templating") or {}).get("list") or []}
        for panel in dashboard.get("panels") or []:
            if panel.get("type") == "row":
                continue
            if "gridPos" not in panel:
                report.error(f"{path.name}: panel {panel.get('title')} has no gridPos")
            uid = (panel.get("datasource") or {}).get("uid", "")
            if uid.startswith("${"):
                if uid[2:-1] not in variables:
                    report.error(f"{path.name}: panel {panel.get('title')} uses an undefined variable {uid}")
            elif uid not in uids:
                report.error(f"{path.name}: panel {panel.get('title')} uses datasource {uid!r}, which is not provisioned")
            if not panel.get("targets") or not all(t.get("expr") for t in panel["targets"]):
                report.error(f"{path.name}: panel {panel.get('title')} has a target without a query")
        exprs = " ".join(e for _, e in dashboard_exprs(dashboard))
        for metric in REQUIRED_DASHBOARD_METRICS:
            if metric not in exprs:
                report.error(f"{path.name}: no panel shows {metric}")
    # nginx: both listeners, proxied to the api service.
    nginx = (COMPOSE_DIR / "nginx.conf").read_text()
    body = re.sub(r"#.*", "", nginx)
    if body.count("{") != body.count("}"):
        report.error("nginx.conf: unbalanced braces")
    for port in ("8080", "8081"):
        if f"listen {port};" not in body or f"http://api:{port}" not in body:
            report.error(f"nginx.conf: no server for {port} proxying to api:{port}")
    return report.finish(f"otel collector, grafana ({len(dashboards)} dashboard(s)), nginx")


def cmd_promql(args: argparse.Namespace) -> int:
    """Every PromQL expression of the dashboards and autoscalers, as a rules file."""
    exprs: list[tuple[str, str]] = []
    for path in sorted((COMPOSE_DIR / "grafana/dashboards").glob("*.json")):
        for title, expr in dashboard_exprs(json.loads(path.read_text())):
            exprs.append((f"{path.name}: {title}", expr))
    for path in sorted((DEPLOY / "kubernetes").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "ScaledObject":
                for trig in doc["spec"]["triggers"]:
                    if trig["type"] == "prometheus":
                        exprs.append((f"{path.relative_to(DEPLOY)}: {doc['metadata']['name']}", trig["metadata"]["query"]))
            if isinstance(doc, dict) and "rules" in doc and isinstance(doc["rules"], dict):
                for rule in doc["rules"].get("external") or []:
                    query = rule["metricsQuery"].replace("<<.Series>>", "gantry_queue_depth")
                    query = query.replace("<<.LabelMatchers>>", 'namespace="gantry"').replace("<<.GroupBy>>", "model")
                    exprs.append((f"{path.relative_to(DEPLOY)}: adapter rule", query))
    rules = []
    for i, (where, expr) in enumerate(exprs):
        expr = expr.replace("$__rate_interval", "1m").replace('"$model"', '".*"')
        rules.append({"record": f"gantry:check_{i}", "expr": expr, "labels": {"source": where[:100]}})
    Path(args.file).write_text(yaml.safe_dump({"groups": [{"name": "gantry-deploy-check", "rules": rules}]}, sort_keys=False))
    print(f"promql: {len(rules)} expressions written to {args.file}")
    return 0


# ---- Dockerfile ------------------------------------------------------------------------------

def cmd_dockerfile(args: argparse.Namespace) -> int:
    report = Report("dockerfile")
    path = DEPLOY / "Dockerfile"
    lines = []
    for raw in path.read_text().replace("\\\n", " ").splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            lines.append(line)
    global_args: dict[str, str] = {}
    stages: list[tuple[str, str]] = []  # (from, name)
    for line in lines:
        word = line.split()[0].upper()
        if word == "ARG" and not stages:
            name, _, default = line.split(None, 1)[1].partition("=")
            global_args[name] = default.strip('"')
        if word == "FROM":
            m = re.match(r"FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", line, re.I)
            stages.append((m.group(1), (m.group(2) or "").lower()))
    names = {n for _, n in stages if n}
    variants = ["cpu", "cuda"]
    if global_args.get("VARIANT") != "cpu":
        report.error("the default VARIANT must be cpu")
    for variant in variants:
        for base, name in stages:
            resolved = base.replace("${VARIANT}", variant)
            if "${VARIANT}" in base and resolved not in names:
                report.error(f"VARIANT={variant}: stage {resolved} (FROM {base}) is not defined")
    for line in lines:
        m = re.search(r"--from=(\S+)", line)
        if line.upper().startswith("COPY") and m and m.group(1).lower() not in names and ":" not in m.group(1):
            report.error(f"{line}: stage {m.group(1)} is not defined")
    last_from = max(i for i, line in enumerate(lines) if line.upper().startswith("FROM"))
    tail = lines[last_from:]
    text = "\n".join(lines)
    expect = {
        "cargo build --release --locked -p gantry": "the build command",
        'ENTRYPOINT ["gantry"]': "the entrypoint",
        'CMD ["serve"]': "the default command",
        "GANTRY_MODELS_DIR=/models": "the models directory",
        "python3-pip": "pip (weight pulls)",
        'VOLUME ["/data", "/models"]': "the volumes",
    }
    for needle, what in expect.items():
        if needle not in text:
            report.error(f"missing {what}: {needle}")
    user = next((line.split()[1] for line in tail if line.upper().startswith("USER ")), None)
    if user is None:
        report.error("the runtime stage runs as root (no USER)")
    elif "GANTRY_UID" in user and global_args.get("GANTRY_UID", "10001") in ("0", "root"):
        report.error("the runtime user is root")
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    for needed in ("target", ".git"):
        if needed not in ignore:
            report.error(f"Dockerfile.dockerignore must exclude {needed} (it would be sent as build context)")
    return report.finish(f"{len(stages)} stages, variants {', '.join(variants)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    k8s = sub.add_parser("k8s")
    k8s.add_argument("file")
    k8s.add_argument("--target", required=True)
    k8s.add_argument("--versions", nargs="+", default=["1.30"])
    k8s.add_argument("--external-secret", action="append", default=[])
    compose = sub.add_parser("compose")
    compose.add_argument("file")
    sub.add_parser("observability")
    promql = sub.add_parser("promql")
    promql.add_argument("file")
    sub.add_parser("dockerfile")
    args = parser.parse_args()
    return {
        "k8s": cmd_k8s, "compose": cmd_compose, "observability": cmd_observability,
        "promql": cmd_promql, "dockerfile": cmd_dockerfile,
    }[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
