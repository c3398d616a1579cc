"""The agent's two deliveries end only once the broker has all they were
given before they were told to finish: what arrives while a request is in
flight is still sent (a job's last line once stayed on the node, the job
SUCCEEDED with only its first)."""
from __future__ import annotations

from pathlib import Path

from spotbroker.agent.config import RunnerConfig
from spotbroker.agent.delivery import EventSender, LogShipper
from spotbroker.agent.outbox import Outbox


class Broker:
    """The broker's side of the channel, in memory."""

    def __init__(self) -> None:
        self.log = b""
        self.events: list[dict] = []
        self.on_post = None  # called once, during the first request

    def _during(self) -> None:
        if self.on_post is not None:
            action, self.on_post = self.on_post, None
            action()

    def post_log(self, offset: int, chunk: bytes, node: int = 0) -> int:
        if offset == len(self.log):
            self.log += chunk
        self._during()
        return len(self.log)

    def post_events(self, events: list[dict]) -> dict:
        self.events.extend(events)
        self._during()
        return {}


def config() -> RunnerConfig:
    return RunnerConfig(command=["true"], log_interval=0.05, retry_initial=0.01, retry_max=0.05)


def test_output_written_while_a_chunk_is_in_flight_is_shipped_before_the_shipper_ends(tmp_path: Path):
    log = tmp_path / "trainer.log"
    log.write_bytes(b"first line\n")
    broker = Broker()
    shipper = LogShipper(log, broker, config())

    def trainer_ends_meanwhile() -> None:  # its last line, then the supervisor's finish
        with log.open("ab") as f:
            f.write(b"last line\n")
        shipper.finish()

    broker.on_post = trainer_ends_meanwhile
    shipper.start()
    shipper.join(5)
    assert not shipper.is_alive()
    assert broker.log == b"first line\nlast line\n"


def test_an_event_added_as_the_sender_finds_nothing_pending_is_delivered(tmp_path: Path):
    broker = Broker()

    class RacingOutbox(Outbox):
        """Nothing pending at the sender's look; the exit and finish() come right after it."""

        raced = False

        def wait_pending(self, timeout: float) -> bool:
            pending = super().wait_pending(timeout)
            if not pending and not self.raced:
                self.raced = True
                self.add("trainer_exited", {"exit_code": 0})
                sender.finish()
            return pending

    outbox = RacingOutbox(tmp_path)
    sender = EventSender(outbox, broker, config(), on_cancel=lambda: None)
    sender.start()
    sender.join(5)
    assert not sender.is_alive()
    assert [e["type"] for e in broker.events] == ["trainer_exited"]


def test_a_plain_http_broker_gets_no_ca_bundle_and_an_https_one_is_verified():
    """The CA bundle is parsed only for an https broker (it cost every job's
    agent ~20 ms of CPU for a broker on plain HTTP); a plain-HTTP client's
    context still verifies, and trusts no issuer."""
    import ssl

    from spotbroker.agent.delivery import _tls_for

    plain = _tls_for("http://127.0.0.1:8000")
    assert plain.verify_mode == ssl.CERT_REQUIRED and plain.check_hostname
    assert plain.cert_store_stats()["x509_ca"] == 0
    assert _tls_for("https://broker.example") is True and _tls_for("HTTPS://broker.example") is True
