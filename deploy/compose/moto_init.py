"""Make what docker-compose.yml's broker expects in its moto server: the
checkpoint bucket and the node role (SPOTBROKER_NODE_ROLE_ARN) that the broker
assumes to mint each node's storage credentials. Idempotent: run by the
`moto-init` service on every `docker compose up`.

    python moto_init.py   # AWS_ENDPOINT_URL, SPOTBROKER_CHECKPOINT_ROOT, SPOTBROKER_NODE_ROLE_ARN
"""
from __future__ import annotations

import json
import os
import time
from urllib.parse import urlparse

import boto3
from botocore.exceptions import ClientError, EndpointConnectionError


def main() -> None:
    bucket = urlparse(os.environ["SPOTBROKER_CHECKPOINT_ROOT"]).netloc
    role_arn = os.environ["SPOTBROKER_NODE_ROLE_ARN"]
    account, role = role_arn.split(":")[4], role_arn.rsplit("/", 1)[1]
    s3, iam = boto3.client("s3"), boto3.client("iam")
    for wait in range(30):  # moto starts alongside
        try:
            s3.create_bucket(Bucket=bucket)
            break
        except EndpointConnectionError:
            if wait == 29:
                raise
            time.sleep(1)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "BucketAlreadyOwnedByYou":
                raise
            break
    trust = {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{account}:root"}, "Action": "sts:AssumeRole"}]}
    try:
        iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps(trust))
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "EntityAlreadyExists":
            raise
    # The session policy the broker adds narrows this to one attempt's prefix.
    iam.put_role_policy(RoleName=role, PolicyName="checkpoints", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": "s3:*",
            "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]}))
    print(f"moto: bucket {bucket} and role {role_arn} ready")


if __name__ == "__main__":
    main()
