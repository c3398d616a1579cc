"""Loading trace sets: zone names, regions, and every bad input named clearly."""
from __future__ import annotations

import json

import pytest

from spotbroker.broker.placement.policy.egress import EgressPrices, region_of
from spotbroker.broker.sim.runner import check_windows, job_from_hours
from spotbroker.broker.sim.traces import TraceError, load_traces


def write(tmp_path, name, data, gap=195, prices=None, flat=None, od=3.06):
    info = {"on_demand_price": od}
    if flat is not None:
        info["price"] = flat
    body = {"metadata": {"gap_seconds": gap, "price_info": info}, "data": data}
    if prices is not None:
        body["prices"] = prices
    (tmp_path / name).write_text(json.dumps(body))


def test_zone_is_the_file_name_or_its_prefix(tmp_path):
    write(tmp_path, "us-east-1c_v100_1.json", [0, 1, 0], prices=[1.0, 1.1, 1.2])
    write(tmp_path, "us-central1-a.json", [1, 1, 0], flat=0.5, od=2.0)
    traces = load_traces(tmp_path, ["us-central1-a", "us-east-1c"])
    assert traces.names == ["us-central1-a", "us-east-1c"]  # the order given, not the directory's
    gcp, aws = traces.zones
    assert (gcp.region, aws.region) == ("us-central1", "us-east-1")
    assert list(gcp.spot_price) == [0.5, 0.5, 0.5] and gcp.on_demand_price == 2.0
    assert list(aws.unavailable) == [False, True, False]
    assert traces.gap_s == 195 and traces.n_ticks == 3


def test_regions_and_egress_follow_the_protocol():
    assert region_of("us-west-2a") == "us-west-2"
    assert region_of("europe-west4-b") == "europe-west4"
    egress = EgressPrices()
    assert egress.fee("us-east-1c", "us-east-2b", 50) == pytest.approx(0.5)
    assert egress.fee("us-east-2b", "us-west-2a", 50) == pytest.approx(1.0)
    assert egress.fee("us-east-1c", "us-east-1d", 50) == 0
    assert egress.fee(None, "us-west-2a", 50) == 0  # the first launch
    assert egress.fee("us-central1-a", "us-east-1c", 50) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "files, zones, message",
    [
        ({"a-1a.json": ([0, 0], 195), "b-1a.json": ([0, 0, 0], 195)}, ["a-1a", "b-1a"], "different lengths"),
        ({"a-1a.json": ([0, 0], 195), "b-1a.json": ([0, 0], 600)}, ["a-1a", "b-1a"], "different tick lengths"),
        ({"a-1a.json": ([0, 0], 195)}, ["a-1a", "a-1a"], "named twice"),
        ({"a-1a.json": ([0, 0], 195)}, ["nowhere-1a"], "no file nowhere-1a.json"),
        ({"a-1a.json": ([0, 2], 195)}, ["a-1a"], "0/1"),
    ],
)
def test_bad_trace_sets_name_the_problem(tmp_path, files, zones, message):
    for name, (data, gap) in files.items():
        write(tmp_path, name, data, gap=gap, flat=1.0)
    with pytest.raises(TraceError, match=message):
        load_traces(tmp_path, zones)


def test_a_missing_price_is_named(tmp_path):
    write(tmp_path, "a-1a.json", [0, 0])
    with pytest.raises(TraceError, match="price"):
        load_traces(tmp_path, ["a-1a"])


def test_window_beyond_the_trace_and_impossible_deadline(tmp_path):
    write(tmp_path, "a-1a.json", [0] * 100, gap=600, flat=1.0)
    traces = load_traces(tmp_path, ["a-1a"])
    job = job_from_hours(5, 10, 0.2, 50)  # 60 ticks of window
    check_windows(traces, job, [39])
    with pytest.raises(TraceError, match="past the end of the trace"):
        check_windows(traces, job, [40])
    with pytest.raises(TraceError, match="deadline .* shorter than the work"):
        job_from_hours(10, 10, 0.2, 50)
