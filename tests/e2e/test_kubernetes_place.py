"""A job's whole life on one of the operator's Kubernetes clusters, through
the served API and the local launcher, which runs the place on this host as
it runs a cloud's (a node process, the agent, the job's environment) but
with no metadata simulator: no cloud reclaims a cluster. Then its money: the
ledger bills the configured price per GPU-hour (zero included) and the
dashboard shows it. SQLite only: the database side is
tests/broker/placement/test_kubernetes_places.py's, on both."""
from __future__ import annotations

import pytest
import yaml
from conftest import ADMIN_TOKEN, served
from support.helpers import stop_local_nodes, wait_state

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
RUN = "echo cloud=$SPOTBROKER_CLOUD region=$SPOTBROKER_REGION gpus=$SKYPILOT_NUM_GPUS_PER_NODE; sleep 3"


@pytest.fixture
def k8s_api(settings, tmp_path):
    places = tmp_path / "kubernetes.yaml"
    places.write_text(yaml.safe_dump({"clusters": [
        {"context": "lab-a", "nodes": [{"accelerator": "H100", "gpus_per_node": 8, "count": 1}]},
        {"context": "lab-b", "price_per_gpu_hour": 2.5,
         "nodes": [{"accelerator": "L4", "gpus_per_node": 4, "count": 1}]}]}))
    settings.kubernetes_places = places
    with served(settings) as client:
        yield client
    stop_local_nodes(settings.data_dir)


def new_team(api, name: str) -> dict[str, str]:
    r = api.post("/v1/teams", json={"name": name}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def test_a_job_runs_its_whole_life_on_a_cluster_and_is_billed_its_configured_price(k8s_api, settings):
    api, h = k8s_api, new_team(k8s_api, "ml")
    free = api.post("/v1/jobs", json={"name": "on-lab-a", "run": RUN, "resources": {"accelerators": "H100:8"}},
                    headers=h).json()["id"]
    priced = api.post("/v1/jobs", headers={**h, "Content-Type": "application/yaml"}, content=(
        f"name: on-lab-b\nrun: '{RUN}'\nresources: {{infra: k8s/lab-b, accelerators: L4:2}}\n").encode()).json()["id"]
    running = wait_state(api, h, free, {"RUNNING"}, timeout=60)
    (attempt,) = running["attempts"]
    assert (attempt["cloud"], attempt["region"], attempt["use_spot"], attempt["price_per_hour"]) == (
        "k8s", "lab-a", False, 0.0)
    # never reclaimed: there is no notice to simulate
    r = api.post(f"/v1/jobs/{free}/simulate-preemption", headers=h)
    assert r.status_code == 409 and "Kubernetes place" in r.json()["detail"], r.text
    for job_id in (free, priced):
        job = wait_state(api, h, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=60)
        assert job["state"] == "SUCCEEDED", api.get(f"/v1/jobs/{job_id}/events", headers=h).text
        assert len(job["attempts"]) == 1
    logs = api.get(f"/v1/jobs/{free}/logs", headers=h).text
    assert "cloud=k8s region=lab-a gpus=8" in logs, logs
    assert "cloud=k8s region=lab-b gpus=2" in api.get(f"/v1/jobs/{priced}/logs", headers=h).text
    with pytest.raises(FileNotFoundError):  # no metadata simulator ran for the node
        (settings.data_dir / "runs" / str(attempt["id"]) / "sim.url").read_text()

    costs = api.get("/v1/teams/ml/costs", params={"group_by": "job"}, headers=h).json()
    by_job = {g["name"]: g for g in costs["groups"]}
    lab_a, lab_b = by_job["on-lab-a"], by_job["on-lab-b"]
    assert lab_a["node_hours"] > 0 and lab_a["cost"] == 0 == lab_a["savings"]
    assert lab_b["cost"] == pytest.approx(2.5 * 2 * lab_b["node_hours"], rel=1e-3) and lab_b["cost"] > 0
    assert lab_b["savings"] == 0  # nothing is claimed against a price the cluster never had
    assert costs["total"]["cost"] == pytest.approx(lab_b["cost"])
    by_cloud = api.get("/v1/teams/ml/costs", params={"group_by": "cloud"}, headers=h).json()["groups"]
    assert [g["key"] for g in by_cloud] == ["k8s"]

    # the dashboard draws a team whose jobs cost nothing per hour
    r = api.post("/dashboard/login", data={"token": h["Authorization"].split()[1]},
                 headers={"Origin": str(api.base_url).rstrip("/")}, follow_redirects=True)
    assert r.status_code == 200 and "on-lab-a" in r.text and "k8s" in r.text, r.text[:500]
