"""Price tracking figures (issue 12).

    .venv/bin/python bench/prices.py [--offers 50000] [--kinds sqlite,postgresql] [--parts 1,2,3,4]

Prints, per database:
1. the ranked-offers query over >= 50,000 current offers: p50/p99 in-process
   (`ranked_prices`, the `/v1/prices` query; `rank_offers` and the
   placement pass's `Placer._candidates`, the placement path) and over HTTP
   (`GET /v1/prices` on a real server, in this process: the CPU time per
   request counts client and server, and does not depend on the machine's
   load as the wall-clock percentiles do);
2. a full refresh of each live source from the local fakes at a real API's
   volume (AWS ~30 regions through moto's server, Azure's GPU meters in 64
   regions, GCP's SKUs for 128 regions): seconds, rows written per second,
   peak Python memory (tracemalloc) of the refresh;
3. history growth: samples per day at the default intervals with the change
   rates stated below, simulated through the real write path, and the
   query time of one offer's 90-day series;
4. a full refresh of `aws-public` from AWS's price-list files at their real
   size (the local fake: 23 regions, us-east-1's file 300 MB): seconds, MB
   read and rows written per second, peak Python memory.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The served app's price tracker reads the snapshot only: a figure must not
# depend on the network (serve's default adds the live public sources).
os.environ.setdefault("SPOTBROKER_PRICES_SOURCES", "catalog")

from _db import temporary_database  # noqa: E402

from spotbroker.broker.jobs.spec import JobSpec  # noqa: E402
from spotbroker.broker.placement.placer import Placer  # noqa: E402
from spotbroker.broker.pricing import catalog, store  # noqa: E402
from spotbroker.broker.pricing.fakes import clouds as fakes  # noqa: E402
from spotbroker.broker.pricing.fakes import data as fake_data  # noqa: E402
from spotbroker.broker.pricing.offers import rank_offers  # noqa: E402
from spotbroker.broker.pricing.query import PriceQuery, ranked_prices  # noqa: E402
from spotbroker.broker.pricing.settings import PricingSettings  # noqa: E402
from spotbroker.broker.pricing.tracker import PriceTracker  # noqa: E402
from spotbroker.broker.settings import Settings  # noqa: E402
from spotbroker.broker.store import migrate  # noqa: E402
from spotbroker.broker.store.db import make_engine, make_session_factory, transaction  # noqa: E402

NOW = datetime(2026, 11, 25, tzinfo=UTC)
# Change rates assumed for the history figure (per offer): AWS spot prices
# move a few times a day since the 2017 smoothing (one change per 8 h here),
# Azure and GCP spot prices about monthly (GCP: at most once in 30 days),
# on-demand list prices a few times a year.
CHANGES_PER_DAY = {"aws": 3.0, "azure": 1 / 30, "gcp": 1 / 30}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def timed(fn, n: int, cpu: list[float] | None = None) -> tuple[float, float]:
    """p50 and p99 wall-clock ms of `fn`; the mean CPU ms is appended to `cpu`."""
    fn()  # warm
    samples = []
    c = time.process_time()
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000)
    if cpu is not None:
        cpu.append((time.process_time() - c) * 1000 / n)
    return statistics.median(samples), pct(samples, 0.99)


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def many_offers(n: int) -> list[catalog.OfferRow]:
    """`n` offers: the snapshot's real rows, repeated over made-up region copies."""
    base = catalog.snapshot_rows()
    rows, copy = [], 0
    while len(rows) < n:
        rows += [replace(r, region=f"{r.region}-{copy}" if copy else r.region) for r in base]
        copy += 1
    return rows[:n]


def load_offers(factory, rows) -> float:
    t = time.perf_counter()
    for cloud in ("aws", "gcp", "azure"):
        with transaction(factory) as s:
            store.apply_refresh(s, "catalog", [r for r in rows if r.cloud == cloud], NOW, {cloud: None})
    return time.perf_counter() - t


def query_figures(factory, settings: PricingSettings) -> None:
    queries = {
        "A100:8 spot (the issue's example)": PriceQuery(accelerator="A100", count=8),
        "no filter, limit 50": PriceQuery(),
        "H100:8 on-demand, aws, <= $60/h": PriceQuery(accelerator="H100", count=8, spot=False, cloud="aws",
                                                      max_price=60),
        "L4, limit 1000": PriceQuery(accelerator="L4", limit=1000),
    }
    with factory() as s:
        for name, q in queries.items():
            p50, p99 = timed(lambda q=q: ranked_prices(s, q, settings, NOW), 200)
            print(f"    ranked_prices {name:38} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms")
        spec = JobSpec.model_validate({"run": "x", "resources": {"accelerators": "A100:8"}})
        p50, p99 = timed(lambda: rank_offers(s, spec), 200)
        print(f"    rank_offers (placement) A100:8                 p50 {p50:6.2f} ms  p99 {p99:6.2f} ms")
        placer = Placer(Settings(database_url="sqlite://", admin_token="bench-admin", secret_key="bench",
                                 _env_file=None))

        def candidates() -> None:
            placer.new_pass()
            placer._candidates(s, spec, "A100:8")
        p50, p99 = timed(candidates, 200)
        print(f"    Placer._candidates (a pass) A100:8             p50 {p50:6.2f} ms  p99 {p99:6.2f} ms")


def serve(url: str, data_dir: Path):
    """The real app on a real socket; (client, stop)."""
    import socket
    import threading

    import httpx
    import uvicorn

    from spotbroker.api.app import create_app
    from spotbroker.broker import auth
    from spotbroker.broker.settings import Settings

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = Settings(database_url=url, data_dir=data_dir, admin_token="bench-admin", port=port,
                        local_launcher=False, secret_key="bench", _env_file=None)
    server = uvicorn.Server(uvicorn.Config(create_app(settings, run_reconciler=False), host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    engine = make_engine(url)
    with transaction(make_session_factory(engine)) as s:
        _, token = auth.create_team(s, "bench")
    engine.dispose()
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"})

    def stop() -> None:
        client.close()
        server.should_exit = True
        thread.join(10)

    return client, stop


def over_http(url: str, data_dir: Path) -> None:
    client, stop = serve(url, data_dir)
    try:
        for name, params in (("A100:8 spot", {"accelerator": "A100", "count": 8}), ("no filter", {}),
                             ("L4, limit 1000", {"accelerator": "L4", "limit": 1000})):
            def get(params=params):
                r = client.get("/v1/prices", params=params)
                assert r.status_code == 200, r.text
            cpu: list[float] = []
            p50, p99 = timed(get, 200, cpu)
            print(f"    GET /v1/prices {name:37} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  "
                  f"CPU {cpu[0]:5.2f} ms/request")
    finally:
        stop()


def _moto_child(conn) -> None:
    """moto's EC2 in a process of its own, answering spot prices from the
    snapshot: the refresh's time and memory are then the broker's, as
    against AWS, and moto's work does not share the broker's interpreter."""
    from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend
    from moto.server import ThreadedMotoServer

    names = {z.zone_id: z.name for zones in RegionsAndZonesBackend.zones.values() for z in zones}
    spot = {(names[zid], t): [(NOW - timedelta(minutes=5), p)] for (zid, t), p in fake_data.aws_spot_prices().items()
            if zid in names}
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    with fakes.moto_spot_prices(spot):
        conn.send(moto.get_host_and_port())
        conn.recv()  # until the bench is done
    moto.stop()


@contextmanager
def moto_process() -> Iterator[str]:
    """The endpoint of moto's server running in a child process."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_moto_child, args=(child,), daemon=True)
    proc.start()
    try:
        host, port = parent.recv()
        yield f"http://{host}:{port}"
    finally:
        parent.send("stop")
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def refresh_figures(factory) -> None:
    import boto3

    from spotbroker.broker.pricing.aws import AwsSource
    from spotbroker.broker.pricing.azure import AzureSource
    from spotbroker.broker.pricing.azure_eviction import EvictionRates
    from spotbroker.broker.pricing.gcp import GcpSource

    fake = fakes.FakeClouds(azure_items=fake_data.azure_items(scale=8), gcp_skus=fake_data.gcp_skus(scale=4),
                            azure_evictions=fake_data.azure_evictions(scale=8),
                            gcp_machine_types=fake_data.gcp_machine_types(scale=4),
                            gcp_accelerator_types=fake_data.gcp_accelerator_types(scale=4),
                            aws_products=fake_data.aws_products(), aws_advisor=fake_data.aws_advisor(),
                            page_size=1000).start()
    print(f"  inputs: Azure {len(fake.azure_items):,} meters and {len(fake.azure_evictions):,} eviction bands, "
          f"GCP {len(fake.gcp_skus):,} SKUs and {len(fake.gcp_machine_types):,} zonal machine types, "
          f"AWS {len(fake.aws_products):,} products + moto's regions (moto in a process of its own)")
    total = 0.0
    try:
        with moto_process() as moto_url:
            # The source's default region workers: moto answers them side by
            # side from its own process, as AWS's regional endpoints would.
            settings = PricingSettings(_env_file=None, aws_endpoint_url=moto_url, timeout=600,
                                       aws_pricing_endpoint_url=fake.url, aws_scores_endpoint_url=fake.url,
                                       aws_advisor_url=f"{fake.url}/spot-advisor-data.json",
                                       gcp_endpoint=fake.url, gcp_project="bench")

            def new_sources() -> dict:  # no client nor cached list from an earlier refresh
                session = boto3.session.Session(aws_access_key_id="bench", aws_secret_access_key="bench")
                return {"aws": AwsSource(settings, session=session),
                        "azure": AzureSource(f"{fake.url}/api/retail/prices", regions=[], timeout=60,
                                             evictions=EvictionRates(_Token(), fake.url, 60)),
                        "gcp": GcpSource.from_settings(settings)}
            sources = new_sources()
            tracker = PriceTracker(factory, sources, settings)
            for name in sources:
                tracemalloc.start()
                t, cpu = time.perf_counter(), time.process_time()
                result = tracker.refresh(name, force=True)
                took, cpu = time.perf_counter() - t, time.process_time() - cpu
                peak = tracemalloc.get_traced_memory()[1] / 2**20
                tracemalloc.stop()
                if result is None:
                    print(f"    {name:6} failed after {took:.1f} s (see the log line above)")
                    continue
                total += took
                written = result.new + result.changed + result.samples
                print(f"    {name:6} {took:6.1f} s (CPU {cpu:5.1f} s)  {result.new:6,} offers  "
                      f"{written / took:8,.0f} rows/s  peak {peak:6.1f} MB (Python heap)")
            print(f"    all three: {total:.1f} s, one after the other")
            side_by_side(factory, new_sources(), settings)
    finally:
        fake.stop()


def side_by_side(factory, sources: dict, settings: PricingSettings) -> None:
    """All three refreshed at once into empty tables, as `serve` starts
    them (the tracker gives each source a thread of its own)."""
    import threading

    from sqlalchemy import delete

    from spotbroker.broker.store.models import Offer, PriceOffer, PriceSourceLease
    with transaction(factory) as s:
        for table in (Offer, PriceOffer, PriceSourceLease):
            s.execute(delete(table))
    tracker = PriceTracker(factory, sources, settings)
    results: dict = {}
    threads = [threading.Thread(target=lambda n=n: results.__setitem__(n, tracker.refresh(n, force=True)))
               for n in sources]
    tracemalloc.start()
    t, cpu = time.perf_counter(), time.process_time()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    took, cpu = time.perf_counter() - t, time.process_time() - cpu
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    offers = sum(r.new for r in results.values() if r is not None)
    failed = [n for n, r in results.items() if r is None]
    print(f"    all three side by side (as serve runs them): {took:.1f} s (CPU {cpu:.1f} s), {offers:,} offers, "
          f"peak {peak:.1f} MB (Python heap){'; failed: ' + ', '.join(failed) if failed else ''}")


def aws_public_figures(factory, largest_mb: float) -> None:
    """A full refresh of `aws-public` from the local fake: the snapshot's 23
    regions, each offer file sized like the real ones (us-east-1's about
    300 MB in 2026; the others in proportion to the GPU offers the snapshot
    has there, at least a sixth of it), read twice (the second traced for
    peak memory), then a refresh with nothing published since."""
    from collections import Counter

    from sqlalchemy import delete

    from spotbroker.broker.pricing.aws_public import AwsPublicSource
    from spotbroker.broker.pricing.fakes.price_list import INDEX_PATH, PriceListFiles
    from spotbroker.broker.store.models import Offer, PriceListFile, PriceOffer

    files = PriceListFiles()
    per_region = Counter(r.region for r in catalog.snapshot_rows() if r.cloud == "aws")
    for region, f in files.files.items():
        f.mb = largest_mb * max(1 / 6, per_region[region] / per_region["us-east-1"])
    sizes = {region: files.size(region) / 2**20 for region in files.files}
    fake = fakes.FakeClouds(aws_advisor=fake_data.aws_advisor(), aws_price_list=files).start()
    settings = PricingSettings(_env_file=None, aws_public_url=fake.url + INDEX_PATH, timeout=60,
                               aws_advisor_url=f"{fake.url}/spot-advisor-data.json")
    tracker = PriceTracker(factory, {"aws-public": AwsPublicSource(settings, factory)}, settings)
    print(f"    inputs: {len(sizes)} regions' offer files, {sum(sizes.values()):,.0f} MB in all "
          f"({min(sizes.values()):.0f}-{max(sizes.values()):.0f} MB each), the advisor feed")
    try:
        for label, traced in (("full refresh", False), ("full refresh, traced", True), ("nothing new", False)):
            if label != "nothing new":
                with transaction(factory) as s:  # forget every file and offer: all are read and written again
                    for table in (PriceListFile, PriceOffer, Offer):
                        s.execute(delete(table))
            if traced:
                tracemalloc.start()
            t, cpu = time.perf_counter(), time.process_time()
            result = tracker.refresh("aws-public", force=True)
            took, cpu = time.perf_counter() - t, time.process_time() - cpu
            peak = f"peak {tracemalloc.get_traced_memory()[1] / 2**20:6.1f} MB (Python heap)" if traced else ""
            tracemalloc.stop()
            written = result.new + result.changed + result.samples
            read = sum(sizes.values()) if label != "nothing new" else 0
            print(f"    aws-public {label:22} {took:6.1f} s (CPU {cpu:5.1f} s, client and fake)  "
                  f"{read / took:6.0f} MB/s read  {result.new + result.changed + result.unchanged:,} offers  "
                  f"{written / took:8,.0f} rows written/s  {peak} ({load()})")
    finally:
        fake.stop()


class _Token:
    """A credential as azure-identity gives one (the fake wants a bearer token)."""

    def get_token(self, *scopes, **kwargs):
        from azure.core.credentials import AccessToken

        return AccessToken("bench", int(time.time()) + 3600)


def history_figures(factory, offers_by_cloud: dict[str, int]) -> None:
    settings = PricingSettings(_env_file=None)
    per_day = {c: n * CHANGES_PER_DAY[c] for c, n in offers_by_cloud.items()}
    refreshes = {c: 86400 / settings.interval(c) for c in offers_by_cloud}
    print("    samples per day (offers x changes a day): " + ", ".join(
        f"{c} {per_day[c]:,.0f} ({offers_by_cloud[c]:,} offers, {refreshes[c]:.0f} refreshes)" for c in per_day)
        + f"; total {sum(per_day.values()):,.0f}/day, {90 * sum(per_day.values()):,.0f} rows in 90 days")
    # Through the real write path: one simulated day of AWS refreshes every
    # 5 minutes, each offer changing with the stated probability per refresh.
    rows = [r for r in catalog.snapshot_rows() if r.cloud == "aws"]
    rng, p = random.Random(7), CHANGES_PER_DAY["aws"] / refreshes["aws"]
    written = 0
    for i in range(int(refreshes["aws"])):
        rows = [replace(r, spot_price=round(r.spot_price * rng.uniform(0.95, 1.05), 6))
                if r.spot_price and rng.random() < p else r for r in rows]
        with transaction(factory) as s:
            written += store.apply_refresh(s, "aws", rows, NOW + timedelta(seconds=300 * i), {"aws": None}).samples
    print(f"    one simulated day of AWS refreshes ({len(rows):,} offers, every 5 min): {written:,} samples "
          f"written (first refresh {len(rows):,} + changes)")
    # One offer's 90-day series among the rest: an hourly change for 90 days.
    key = rows[0]
    with transaction(factory) as s:
        for h in range(90 * 24):
            store.apply_refresh(s, "aws", [replace(key, spot_price=round(1 + (h % 17) / 100, 4))],
                                NOW + timedelta(days=2, hours=h), {"aws": frozenset()})
    with factory() as s:
        n = len(store.history(s, "aws", key.zone_id, key.instance_type))
        p50, p99 = timed(lambda: store.history(s, "aws", key.zone_id, key.instance_type,
                                               since=NOW + timedelta(days=2)), 100)
    print(f"    90-day series of one offer ({n:,} samples): p50 {p50:.2f} ms  p99 {p99:.2f} ms ({load()})")


class _Skip(Exception):
    pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--offers", type=int, default=50_000)
    ap.add_argument("--kinds", default="sqlite,postgresql")
    ap.add_argument("--parts", default="1,2,3,4",
                    help="which figures: 1 query, 2 refresh, 3 history, 4 aws-public's files")
    ap.add_argument("--aws-public-mb", type=float, default=300, help="part 4: us-east-1's offer file, MB")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    settings = PricingSettings(_env_file=None)
    for kind in args.kinds.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            url, drop = temporary_database(kind, Path(tmp))
            engine = make_engine(url)
            migrate.upgrade(engine)
            factory = make_session_factory(engine)
            try:
                print(f"\n== {kind} == ({load()})")
                if "1" not in parts:
                    raise _Skip
                rows = many_offers(args.offers)
                took = load_offers(factory, rows)
                print(f"  1. ranked offers over {len(rows):,} current offers (loaded in {took:.1f} s, "
                      f"{len(rows) / took:,.0f} rows/s)")
                query_figures(factory, settings)
                over_http(url, Path(tmp))
                print(f"    ({load()})")
            except _Skip:
                pass
            finally:
                engine.dispose()
                drop()
            url, drop = temporary_database(kind, Path(tmp) / "r" if kind == "sqlite" else Path(tmp))
            if kind == "sqlite":
                (Path(tmp) / "r").mkdir()
            engine = make_engine(url)
            migrate.upgrade(engine)
            factory = make_session_factory(engine)
            try:
                if "2" in parts:
                    print("  2. full refresh from the local fakes")
                    refresh_figures(factory)
                with factory() as s:
                    from sqlalchemy import func, select

                    from spotbroker.broker.store.models import PriceOffer
                    counts = dict(s.execute(select(PriceOffer.cloud, func.count()).group_by(PriceOffer.cloud)).all())
                if "3" in parts:
                    print("  3. history")
                    history_figures(factory, counts or {"aws": 1271, "azure": 1488, "gcp": 643})
                if "4" in parts:
                    print("  4. aws-public: a full refresh from AWS's price-list files (the local fake)")
                    aws_public_figures(factory, args.aws_public_mb)
            finally:
                engine.dispose()
                drop()


if __name__ == "__main__":
    main()
