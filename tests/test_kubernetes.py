"""deploy/kubernetes, offline: the example overlay (and the base) rendered by
`kubectl kustomize` (scripts/ensure-kubectl provides one), every object
valid against the Kubernetes API's schemas (kubernetes-validate, strict: an
unknown or misspelt field fails), every SPOTBROKER_* variable a real setting
whose value parses, and the pieces fit: probes, the migration gate, secrets,
the disruption budget, the grace period against the row lease, the
ServiceAccount's workload identities, the ingress's streaming timeouts, the
SkyPilot API server the brokers name."""
from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.helpers import setting_names

from spotbroker.broker.settings import Settings

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.33"   # the oldest minor release its upstream still supports (2026-11)


def kubectl() -> str:
    for candidate in (REPO / ".tools" / "kubectl" / "kubectl", shutil.which("kubectl")):
        if candidate and Path(candidate).is_file():
            out = subprocess.run([str(candidate), "version", "--client"], capture_output=True, text=True,
                                 timeout=30).stdout
            if "Kustomize Version: v5" in out or "Kustomize Version: v6" in out:
                return str(candidate)
    pytest.skip("no kubectl with kustomize v5: run scripts/ensure-kubectl")


def render(path: str, tmp_path: Path) -> list[dict]:
    tree = tmp_path / "kubernetes"
    shutil.copytree(MANIFESTS, tree, ignore=shutil.ignore_patterns("secrets.env"))
    for example in tree.glob("overlays/*/secrets.env.example"):
        shutil.copy(example, example.with_suffix(""))   # what an operator fills in
    done = subprocess.run([kubectl(), "kustomize", str(tree / path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not done.stderr.strip(), f"kustomize warned: {done.stderr}"   # nothing deprecated
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> dict[tuple[str, str], dict]:
    docs = render("overlays/example", tmp_path_factory.mktemp("render"))
    by_key = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert len(by_key) == len(docs), "two objects share a kind and name"
    return by_key


def one(objects, kind: str, name: str) -> dict:
    """The object of that kind and name; a generated one's name ends in a hash of its content."""
    (found,) = [o for (k, n), o in objects.items() if k == kind and name in (n, n.rsplit("-", 1)[0])]
    return found


def pods(objects):
    """(owner, pod spec) of every workload."""
    for (kind, name), o in objects.items():
        if kind in ("Deployment", "Job"):
            yield name, o["spec"]["template"]["spec"]


def test_every_object_is_valid_against_the_kubernetes_schemas(objects, tmp_path):
    import kubernetes_validate

    for doc in [*objects.values(), *render("base", tmp_path)]:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    kinds = {kind for kind, _ in objects}
    assert {"Deployment", "Job", "Service", "PodDisruptionBudget", "ServiceAccount", "ConfigMap", "Secret",
            "Ingress", "PersistentVolumeClaim", "Namespace"} <= kinds
    assert all(o["metadata"].get("namespace") == "spotbroker" for (kind, _), o in objects.items()
               if kind != "Namespace")


def environment(objects, container: dict) -> dict[str, str]:
    """What the container's environment holds, with the ConfigMap's and the Secret's values."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(one(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
    secret = one(objects, "Secret", "spotbroker")
    for var in container.get("env", []):
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["name"] == secret["metadata"]["name"], f"{var['name']}: no Secret {ref['name']}"
            data = secret.get("data", {})
            assert ref["key"] in data or ref.get("optional"), f"the Secret has no {ref['key']}"
            if ref["key"] in data:
                env[var["name"]] = base64.b64decode(data[ref["key"]]).decode()
        else:
            env[var["name"]] = var["value"]
    return env


def test_every_spotbroker_variable_is_a_real_setting_and_parses(objects, monkeypatch):
    names = setting_names()
    seen = set()
    for owner, spec in pods(objects):
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            if not container["image"].startswith("registry.example.com/spotbroker"):
                continue
            env = environment(objects, container)
            for var in env:
                if var.startswith("SPOTBROKER_"):
                    assert var in names, f"{owner}/{container['name']}: {var} is not a setting"
                    seen.add(var)
            for var in list(os.environ):
                if var.startswith("SPOTBROKER_"):
                    monkeypatch.delenv(var)
            for var, value in env.items():
                monkeypatch.setenv(var, value)
            Settings(_env_file=None)   # every value parses (a bool, a number, the keys' length)
    for data in (o["data"] for (kind, _), o in objects.items() if kind in ("ConfigMap", "Secret")):
        assert {k for k in data if k.startswith("SPOTBROKER_")} <= names
    assert {"SPOTBROKER_ADMIN_TOKEN", "SPOTBROKER_SECRET_KEY", "SPOTBROKER_ENCRYPTION_KEYS",
            "SPOTBROKER_MIGRATE_ON_START", "SPOTBROKER_FORWARDED_ALLOW_IPS"} <= seen


def test_the_brokers_roll_only_past_the_migration_and_outlive_their_leases(objects):
    broker = one(objects, "Deployment", "spotbroker")
    spec = broker["spec"]["template"]["spec"]
    assert broker["spec"]["replicas"] >= 2
    (container,) = spec["containers"]
    assert container["args"] == ["serve"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    env = environment(objects, container)
    lease = float(env.get("SPOTBROKER_LEASE_SECONDS", Settings.model_fields["lease_seconds"].default))
    assert spec["terminationGracePeriodSeconds"] > lease
    assert env["SPOTBROKER_MIGRATE_ON_START"] == "false"   # no pod migrates: the Job does
    (gate,) = spec["initContainers"]
    assert gate["args"] == ["db", "ready"] and gate["image"] == container["image"]
    job = one(objects, "Job", "spotbroker-migrate")
    (migrate,) = job["spec"]["template"]["spec"]["containers"]
    assert migrate["args"] == ["db", "upgrade"] and migrate["image"] == container["image"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    for each in (container, gate, migrate):
        assert each["securityContext"]["allowPrivilegeEscalation"] is False


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_disruption_budget_and_the_services_select_the_pods(objects):
    broker = one(objects, "Deployment", "spotbroker")
    labels = broker["spec"]["template"]["metadata"]["labels"]
    pdb = one(objects, "PodDisruptionBudget", "spotbroker")
    assert selects(pdb["spec"]["selector"]["matchLabels"], labels)
    assert pdb["spec"].get("maxUnavailable", 0) < broker["spec"]["replicas"]
    service = objects[("Service", "spotbroker")]
    assert selects(service["spec"]["selector"], labels)


def test_the_brokers_launch_through_the_skypilot_api_server(objects):
    broker = one(objects, "Deployment", "spotbroker")
    env = environment(objects, broker["spec"]["template"]["spec"]["containers"][0])
    assert env["SPOTBROKER_LAUNCHER"] == "skypilot" and env["SKYPILOT_DISABLE_LOCAL_API_SERVER"] == "1"
    endpoint = env["SKYPILOT_API_SERVER_ENDPOINT"].removeprefix("http://")
    host, port = endpoint.split(":")
    service = objects[("Service", host)]
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}
    server = objects[("Deployment", "spotbroker-skypilot-api")]
    assert selects(service["spec"]["selector"], server["spec"]["template"]["metadata"]["labels"])
    (container,) = server["spec"]["template"]["spec"]["containers"]
    assert container["image"].endswith(":0.14.1")   # the SkyPilot the broker is built against
    assert "--foreground" in container["command"]


def test_the_service_accounts_carry_every_workload_identity(objects):
    for name in ("spotbroker", "spotbroker-skypilot"):
        annotations = objects[("ServiceAccount", name)]["metadata"]["annotations"]
        assert {"eks.amazonaws.com/role-arn", "iam.gke.io/gcp-service-account",
                "azure.workload.identity/client-id"} <= set(annotations)
    for owner, spec in pods(objects):
        assert spec["serviceAccountName"] in ("spotbroker", "spotbroker-skypilot"), owner


def test_the_ingress_streams_logs(objects):
    ingress = objects[("Ingress", "spotbroker")]
    notes = ingress["metadata"]["annotations"]
    assert int(notes["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 3600   # `logs -f` stays open
    assert notes["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert ingress["spec"]["tls"]
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    service = objects[("Service", backend["name"])]
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-n", "0"]))
