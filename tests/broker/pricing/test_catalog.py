"""The bundled catalog snapshot, and the data traps its README lists."""
from spotbroker.broker.pricing.catalog import snapshot_rows


def test_traps_are_handled():
    rows = snapshot_rows()
    assert {r.cloud for r in rows} == {"aws", "gcp", "azure"}
    for r in rows:
        assert r.spot_price is None or r.spot_price > 0          # no blank/zero placeholders
        assert r.ondemand_price is None or r.ondemand_price > 0
        assert r.spot_price is None or r.ondemand_price is None or r.spot_price <= r.ondemand_price
    # a4-highgpu-8g carries only zero placeholders: no offer is made from it.
    assert not [r for r in rows if r.instance_type == "a4-highgpu-8g"]
    nd96 = {r.accelerator_count for r in rows if r.instance_type == "Standard_ND96isr_H100_v5"}
    assert nd96 == {8.0}


def test_gcp_price_is_host_plus_gpu():
    rows = {(r.instance_type, r.zone): r for r in snapshot_rows() if r.cloud == "gcp"}
    a2 = rows[("a2-highgpu-1g", "us-central1-a")]
    # Source rows: host 0.73948 / 0.36975, A100x1 add-on 2.93391 / 1.4341.
    assert a2.accelerator == "A100" and a2.accelerator_count == 1
    assert a2.ondemand_price == round(0.73948 + 2.93391, 6)
    assert a2.spot_price == round(0.36975 + 1.4341, 6)


def test_aws_zones_are_ids_not_names():
    aws = [r for r in snapshot_rows() if r.cloud == "aws"]
    assert all(r.zone is None and r.zone_id for r in aws)


def test_gpus_that_attach_to_n1_are_offered_on_the_sizes_skypilot_would_pick():
    """GCP's T4, V100, P100 and P4 come on an N1 machine: each offer is the pair, priced as the
    N1 host row plus the GPUs' add-on row of the zone, on the sizes GCP allows for that many
    GPUs from the one SkyPilot picks when a task names no cpus (before: no GCP offer at all)."""
    gcp = [r for r in snapshot_rows() if r.cloud == "gcp" and r.zone == "us-central1-a"]
    t4 = {r.instance_type: r for r in gcp if (r.accelerator, r.accelerator_count) == ("T4", 1)}
    assert set(t4) == {"n1-highmem-4+T4:1", "n1-highmem-8+T4:1", "n1-highmem-16+T4:1", "n1-highmem-32+T4:1"}
    # Source rows: n1-highmem-4 0.23661 / 0.06466, T4x1 add-on 0.35 / 0.175.
    first = t4["n1-highmem-4+T4:1"]
    assert (first.vcpus, first.memory_gib) == (4.0, 26.0)
    assert (first.ondemand_price, first.spot_price) == (round(0.23661 + 0.35, 6), round(0.06466 + 0.175, 6))
    # one V100 allows at most 12 vCPUs and 78 GiB: only n1-highmem-8; four T4s at least 48 vCPUs
    assert [r.instance_type for r in gcp if (r.accelerator, r.accelerator_count) == ("V100", 1)] == \
        ["n1-highmem-8+V100:1"]
    assert {r.instance_type for r in gcp if (r.accelerator, r.accelerator_count) == ("T4", 4)} == \
        {"n1-highmem-64+T4:4", "n1-highmem-96+T4:4", "n1-standard-64+T4:4"}
