"""File mounts on the local launcher with an s3:// root (moto's S3 and STS,
IAM enforced, as tests/e2e/test_scoped_credentials.py): a bucket by name
one job writes and the next reads, and a prefix the admin lists read-only,
copied in and never written back. Every object moves with the job's own
scoped credentials."""
from __future__ import annotations

import pytest
from conftest import ADMIN_TOKEN
from support.helpers import timeline, wait_state
from support.iamfixtures import aws_iam, session_policies_enforced  # noqa: F401  (fixtures, found by name)
from support.s3fixtures import moto_endpoint  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]
DONE = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture
def settings(settings, aws_iam, session_policies_enforced):  # noqa: F811
    settings.checkpoint_root = f"s3://{aws_iam.bucket}/root"
    settings.node_role_arn = aws_iam.role_arn
    return settings


def run(api, h, spec: dict) -> dict:
    r = api.post("/v1/jobs", json=spec, headers=h)
    assert r.status_code == 201, r.text
    job = wait_state(api, h, r.json()["id"], DONE, timeout=90)
    logs = api.get(f"/v1/jobs/{job['id']}/logs", headers=h).text
    assert job["state"] == "SUCCEEDED", timeline(api, h, job["id"]) + logs
    return {**job, "logs": logs}


def test_a_named_bucket_written_by_one_job_is_read_by_the_next_and_a_read_only_one_is_never_written(
        api, team_headers, settings, aws_iam):  # noqa: F811
    s3 = aws_iam.client("s3")
    s3.put_object(Bucket=aws_iam.bucket, Key="datasets/imagenet/labels.csv", Body=b"cat,1\n")
    h = team_headers("vision")
    r = api.put("/v1/teams/vision/storage", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                json={"buckets": [{"uri": f"s3://{aws_iam.bucket}/datasets/", "read_only": True}]})
    assert r.status_code == 200, r.text
    mounts = {"~/checkpoint": {"name": "my-ckpts", "mode": "MOUNT"},
              "~/data": {"source": f"s3://{aws_iam.bucket}/datasets/imagenet", "mode": "MOUNT"}}
    run(api, h, {"name": "writer", "file_mounts": mounts, "run": (
        "set -e; grep -q cat ~/data/labels.csv; echo dog,2 >> ~/data/labels.csv; "
        "mkdir -p ~/checkpoint/step-1; echo weights > ~/checkpoint/step-1/model.bin; "
        "ln -s /etc/hostname ~/checkpoint/host-link; echo written")})
    stored = s3.list_objects_v2(Bucket=aws_iam.bucket, Prefix="root/vision/buckets/my-ckpts/")
    assert [o["Key"] for o in stored.get("Contents", [])] == ["root/vision/buckets/my-ckpts/step-1/model.bin"]
    # Read-only: what the job changed in its copy stays on the node.
    assert s3.get_object(Bucket=aws_iam.bucket, Key="datasets/imagenet/labels.csv")["Body"].read() == b"cat,1\n"

    reader = run(api, h, {"name": "reader", "file_mounts": {"~/checkpoint": {"name": "my-ckpts"}},
                          "run": "cat ~/checkpoint/step-1/model.bin"})
    assert "weights" in reader["logs"], reader["logs"]
