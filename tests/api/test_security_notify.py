"""Budget notification targets cannot make the broker reach its own host,
its network or a cloud's metadata service (SSRF): such a target is refused
at PUT naming the field, and checked again, resolved, when each message is
sent (and connected to at the addresses checked: tests/broker/money/test_notify.py).
An operator lists the networks it may reach
(SPOTBROKER_NOTIFY_ALLOWED_NETWORKS)."""
from __future__ import annotations

import pytest

from spotbroker.broker.money import addresses, budgets, notify

ADMIN = {"Authorization": "Bearer admin-token-for-tests"}


INTERNAL = [
    "http://127.0.0.1:8000/v1/teams", "http://localhost/hook", "http://169.254.169.254/latest/meta-data/",
    "http://metadata.google.internal/computeMetadata/v1/", "http://[::1]/x", "http://[::ffff:127.0.0.1]/x",
    "http://2130706433/x", "http://0x7f.1/x", "http://10.1.2.3/x", "http://192.168.0.1/x", "http://0.0.0.0/x",
    "http://[fd00:ec2::254]/latest", "http://app.localhost/x"]


def test_a_target_at_an_internal_address_is_refused_naming_the_field(api, team_headers, settings):
    settings.notify_allowed_networks = []
    team_headers("a")
    for url in INTERNAL:
        body = {"amount": 5, "targets": [{"name": "ops", "kind": "webhook", "url": url}]}
        r = api.put("/v1/teams/a/budget", json=body, headers=ADMIN)
        assert r.status_code == 422, (url, r.text)
        assert r.json()["errors"][0]["field"] == "targets.0.url"
        smtp = {"amount": 5, "targets": [{"name": "m", "kind": "email", "smtp_url": url.replace("http", "smtp", 1),
                                          "to": ["ops@example.com"]}]}
        r = api.put("/v1/teams/a/budget", json=smtp, headers=ADMIN)
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "targets.0.smtp_url", (url, r.text)
    assert api.get("/v1/teams/a/budget", headers=ADMIN).status_code == 404  # nothing was set


def test_a_public_webhook_is_taken_and_a_listed_network_is_allowed(api, team_headers, settings):
    settings.notify_allowed_networks = []
    team_headers("a")
    public = {"amount": 5, "targets": [{"name": "ops", "kind": "webhook", "url": "https://hooks.slack.com/T/B/x"}]}
    assert api.put("/v1/teams/a/budget", json=public, headers=ADMIN).status_code == 200
    relay = {"amount": 5, "targets": [{"name": "ops", "kind": "webhook", "url": "http://10.1.2.3/hook"}]}
    settings.notify_allowed_networks = ["10.0.0.0/8"]
    assert api.put("/v1/teams/a/budget", json=relay, headers=ADMIN).status_code == 200


def test_a_name_is_checked_again_where_it_resolves_before_sending():
    """A public-looking name stored earlier may resolve to the broker's own host now."""
    target = budgets.Target(name="ops", kind="webhook", url="http://rebound.example/hook")
    assert addresses.host_problem(target.host, []) is None  # nothing to say before DNS
    import socket
    real = socket.getaddrinfo

    def resolver(host, *args, **kwargs):
        if host == "rebound.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))]
        return real(host, *args, **kwargs)

    mp = pytest.MonkeyPatch()
    mp.setattr(socket, "getaddrinfo", resolver)
    try:
        with pytest.raises(notify.Refused, match="127.0.0.1"):
            notify.checked_addresses(target.host, 80, [])
        assert notify.checked_addresses(target.host, 80, ["127.0.0.0/8"]) == ["127.0.0.1"]
    finally:
        mp.undo()


def test_the_allowed_networks_setting_is_checked():
    from pydantic import ValidationError

    from spotbroker.broker.settings import Settings

    with pytest.raises(ValidationError, match="notify_allowed_networks"):
        Settings(notify_allowed_networks=["ten-dot-something"], _env_file=None)


# IPv6 spellings that carry an IPv4 address (and reach it), and site-local:
# Python calls every one of them global.
CARRYING_IPV4 = ["::127.0.0.1", "::169.254.169.254", "64:ff9b::7f00:1", "2002:7f00:1::", "::ffff:0:7f00:1",
                 "fec0::1", "2002:a9fe:a9fe::1", "64:ff9b::a00:1", "::ffff:0:a9fe:a9fe", "64:ff9b:1::a00:1"]


def test_an_ipv6_address_carrying_an_internal_ipv4_one_is_refused_at_put(api, team_headers, settings):
    settings.notify_allowed_networks = []
    team_headers("a")
    for address in CARRYING_IPV4:
        for body, field in (
                ({"name": "ops", "kind": "webhook", "url": f"http://[{address}]:8000/x"}, "targets.0.url"),
                ({"name": "m", "kind": "email", "smtp_url": f"smtp://[{address}]:25", "to": ["ops@example.com"]},
                 "targets.0.smtp_url")):
            r = api.put("/v1/teams/a/budget", json={"amount": 5, "targets": [body]}, headers=ADMIN)
            assert r.status_code == 422, (address, r.text)
            assert r.json()["errors"][0]["field"] == field
    assert api.get("/v1/teams/a/budget", headers=ADMIN).status_code == 404
    # What they carry decides: a public IPv4 address inside is a public target.
    for address in ("64:ff9b::808:808", "2002:808:808::1", "::ffff:0:808:808"):
        body = {"amount": 5, "targets": [{"name": "ops", "kind": "webhook", "url": f"http://[{address}]/x"}]}
        assert api.put("/v1/teams/a/budget", json=body, headers=ADMIN).status_code == 200, address


def test_a_name_resolving_to_an_ipv6_address_carrying_an_internal_one_is_refused_at_send(monkeypatch):
    import socket

    real = socket.getaddrinfo
    answer: list[str] = []

    def resolver(host, *args, **kwargs):
        if host == "hook.example":
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (answer[0], 0, 0, 0))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    for address in CARRYING_IPV4:
        answer[:] = [address]
        with pytest.raises(notify.Refused, match="private|site-local"):
            notify.checked_addresses("hook.example", 443, [])
        # and a target stored before this check, naming the address itself
        with pytest.raises(notify.Refused):
            notify.checked_addresses(f"[{address}]", 443, [])
    answer[:] = ["64:ff9b::808:808"]
    assert notify.checked_addresses("hook.example", 443, []) == ["64:ff9b::808:808"]
