"""Settings: the embedded defaults, and the egress table placement reads."""
import pytest
from pydantic import ValidationError

from spotbroker.broker.placement.placer import egress_prices
from spotbroker.broker.placement.policy.egress import EgressPrices
from spotbroker.broker.settings import Settings


def test_embedded_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    s = Settings(_env_file=None)
    assert s.sqlalchemy_url == f"sqlite:///{tmp_path}/.spotbroker/spotbroker.db"
    assert s.checkpoint_uri == (tmp_path / ".spotbroker" / "checkpoints").as_uri()
    assert s.local_launcher_enabled() and not s.local_launcher_enabled("0.0.0.0")
    assert Settings(database_url="postgresql://u@h/db", _env_file=None).sqlalchemy_url == \
        "postgresql+psycopg://u@h/db"


def test_a_broker_on_a_shared_database_is_told_what_its_replicas_must_share(tmp_path):
    """Each replica's own checkpoint root and address lost a killed replica's
    jobs (their code, logs and runs): on a database others can share, an unset
    root or advertised address is said at start."""
    assert Settings(data_dir=tmp_path, _env_file=None).replica_warnings() == []  # SQLite: one host
    pg = "postgresql://u@h/db"
    root, url = Settings(database_url=pg, data_dir=tmp_path, _env_file=None).replica_warnings()
    assert root.startswith("SPOTBROKER_CHECKPOINT_ROOT is unset") and tmp_path.as_uri() in root
    assert url.startswith("SPOTBROKER_ADVERTISE_URL is unset") and "http://127.0.0.1:8000" in url
    assert Settings(database_url=pg, data_dir=tmp_path, checkpoint_root="s3://b", advertise_url="https://sb.example",
                    _env_file=None).replica_warnings() == []


def test_egress_defaults_are_the_protocols(tmp_path):
    prices = egress_prices(Settings(data_dir=tmp_path, _env_file=None))
    protocol = EgressPrices()
    for a, b in [("us-east-1", "us-east-2"), ("us-east-2", "us-west-2"), ("us-east-1", "us-east-1"),
                 ("us-central1", "europe-west4")]:
        assert prices.usd_per_gb(a, b) == protocol.usd_per_gb(a, b)


def test_egress_table_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTBROKER_EGRESS_USD_PER_GB",
                       '{"default": 0.09, "us-west-2, us-east-2": 0.02}')
    prices = egress_prices(Settings(data_dir=tmp_path, _env_file=None))
    assert prices.usd_per_gb("us-east-2", "us-west-2") == 0.02
    assert prices.usd_per_gb("us-east-1", "eu-west-1") == 0.09
    assert prices.fee("us-west-2a", "us-west-2b", 50) == 0.0


@pytest.mark.parametrize("table", ['{"us-east-1": 0.01}', '{"default": -1}', '{"a,b,c": 0.1}'])
def test_a_bad_egress_table_is_a_clear_error(tmp_path, monkeypatch, table):
    monkeypatch.setenv("SPOTBROKER_EGRESS_USD_PER_GB", table)
    with pytest.raises(ValidationError, match="egress_usd_per_gb"):
        Settings(data_dir=tmp_path, _env_file=None)
