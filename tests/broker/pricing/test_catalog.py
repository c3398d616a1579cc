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
