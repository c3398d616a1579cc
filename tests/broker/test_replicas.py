"""Brokers on one database share their checkpoint root and the address
nodes report to (broker/replicas.py): a broker started with a live one's
differing is refused at its start, naming the setting and both values.
Apart, the second root made every checkpoint of its jobs refused by the
other broker ("not this attempt's place") and its uploads unreachable."""
from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from support.brokerproc import broker_env
from support.cli import spotbroker

from spotbroker.broker import replicas
from spotbroker.broker.clock import SYSTEM_CLOCK
from spotbroker.broker.store import migrate
from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
from spotbroker.broker.store.models import BrokerReplica


def running(factory, root: str, advertise: str | None = None, seen_ago_s: float = 1.0, host: str = "b-1",
            key_check: str | None = None) -> None:
    seen = datetime.now(UTC) - timedelta(seconds=seen_ago_s)
    with transaction(factory) as s:
        s.add(BrokerReplica(id=f"{host}-1", host=host, started_at=seen, seen_at=seen, checkpoint_root=root,
                            advertise_url=advertise, signing_key_check=key_check))


def test_a_live_broker_with_another_root_or_address_is_named_and_a_gone_one_is_not(factory):
    me = replicas.Shared("s3://ckpt/root", None)
    running(factory, "s3://ckpt/root")
    with factory() as s:
        assert replicas.disagreements(s, me, datetime.now(UTC)) == []
    running(factory, "file:///data/b/checkpoints", host="b-2")
    running(factory, "s3://elsewhere", seen_ago_s=replicas.STALE_S + 5, host="gone")  # killed a while ago
    with factory() as s:
        (said,) = replicas.disagreements(s, me, datetime.now(UTC))
    assert said.startswith("SPOTBROKER_CHECKPOINT_ROOT is s3://ckpt/root here, file:///data/b/checkpoints in "
                           "the broker b-2-1 on b-2 (seen "), said
    # the address nodes report to: compared where one broker sets it
    with factory() as s:
        said = replicas.disagreements(s, replicas.Shared("file:///data/b/checkpoints", None), datetime.now(UTC),
                                      exclude="b-2-1")
    assert said == ["SPOTBROKER_CHECKPOINT_ROOT is file:///data/b/checkpoints here, s3://ckpt/root in the broker "
                    "b-1-1 on b-1 (seen 1 s ago)"]
    me = replicas.Shared("s3://ckpt/root", "https://broker.example")
    with factory() as s:
        said = replicas.disagreements(s, me, datetime.now(UTC), exclude="b-2-1")
    assert said == ["SPOTBROKER_ADVERTISE_URL is https://broker.example here, unset in the broker b-1-1 on b-1 "
                    "(seen 1 s ago)"]


def test_a_running_broker_keeps_its_row_fresh_and_removes_it_at_its_stop(factory):
    running(factory, "s3://ckpt/root", seen_ago_s=replicas.FORGET_S + 60, host="killed-yesterday")
    running(factory, "s3://ckpt/root", seen_ago_s=replicas.STALE_S + 60, host="killed-just-now")
    settings = SimpleNamespace(checkpoint_uri="s3://ckpt/root/", advertise_url=None, signing_key=lambda: b"key")
    registration = replicas.Registration(factory, replicas.Shared.of(settings), SYSTEM_CLOCK)
    registration.join()
    with factory() as s:  # a killed broker's row goes once it is a day old (they piled up, one a restart)
        assert s.get(BrokerReplica, "killed-yesterday-1") is None and s.get(BrokerReplica, "killed-just-now-1")
    stop = threading.Event()
    keeper = threading.Thread(target=registration.keep, args=(stop,))
    keeper.start()
    with factory() as s:
        row = s.get(BrokerReplica, registration.id)
        assert (row.checkpoint_root, row.advertise_url) == ("s3://ckpt/root", None)
        assert row.signing_key_check == replicas.key_check(b"key") and b"key" not in row.signing_key_check.encode()
    stop.set()
    keeper.join(10)
    with factory() as s:
        assert s.get(BrokerReplica, registration.id) is None


def test_serve_is_refused_beside_a_live_broker_with_another_checkpoint_root(tmp_path):
    url = f"sqlite:///{tmp_path / 'broker.db'}"
    engine = make_engine(url)
    migrate.upgrade(engine)
    running(make_session_factory(engine), "s3://team-bucket/ckpt", host="broker-a")
    engine.dispose()
    env = broker_env(SPOTBROKER_DATABASE_URL=url, SPOTBROKER_DATA_DIR=str(tmp_path / "data"))
    r = spotbroker("serve", "--port", "0", env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "serving on" not in r.stderr, r.stderr
    assert "SPOTBROKER_CHECKPOINT_ROOT is file://" in r.stderr and "s3://team-bucket/ckpt in the broker " \
        "broker-a" in r.stderr, r.stderr


def test_serve_is_refused_beside_a_live_broker_with_another_secret_key(tmp_path):
    """A replica started without the others' SPOTBROKER_SECRET_KEY made its
    own, silently: the agent tokens, dashboard sessions and sealed secrets of
    one broker were refused by the other (jobs with secrets stayed HELD)."""
    url = f"sqlite:///{tmp_path / 'broker.db'}"
    engine = make_engine(url)
    migrate.upgrade(engine)
    factory = make_session_factory(engine)
    running(factory, "s3://ckpt/root", host="broker-a", key_check=replicas.key_check(b"the others' key"))
    running(factory, "s3://ckpt/root", host="broker-old")  # an older broker's row, with no digest: not compared
    engine.dispose()
    env = broker_env(SPOTBROKER_DATABASE_URL=url, SPOTBROKER_DATA_DIR=str(tmp_path / "data"),
                     SPOTBROKER_CHECKPOINT_ROOT="s3://ckpt/root", SPOTBROKER_SECRET_KEY="a key of its own")
    r = spotbroker("serve", "--port", "0", env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "serving on" not in r.stderr, r.stderr
    assert "SPOTBROKER_SECRET_KEY differs here from the broker broker-a-1 on broker-a" in r.stderr, r.stderr
    assert "broker-old" not in r.stderr and "a key of its own" not in r.stderr
