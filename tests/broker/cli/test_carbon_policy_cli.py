"""`teams policy set --carbon-price-per-tonne`: a team's default carbon
price, shown and unset like every rule, run against a real server."""
from __future__ import annotations

import json

from conftest import ADMIN_TOKEN
from support.cli import cells, spotbroker
from support.helpers import team_token


def test_the_admin_sets_and_unsets_a_teams_carbon_price(api, env):
    token = team_token(api, "ml", ADMIN_TOKEN)
    admin = {**env, "SPOTBROKER_TOKEN": token, "SPOTBROKER_ADMIN_TOKEN": ADMIN_TOKEN}
    r = spotbroker("teams", "policy", "set", "ml", "--carbon-price-per-tonne", "100", env=admin)
    assert r.returncode == 0, r.stderr
    assert cells(r.stdout, "carbon_price_per_tonne")[1] == "100.0"
    r = spotbroker("teams", "policy", "set", "ml", "--carbon-price-per-tonne", "-1", env=admin)
    assert r.returncode == 1 and "carbon_price_per_tonne" in r.stderr and "Traceback" not in r.stderr
    r = spotbroker("teams", "policy", "set", "ml", "--unset", "carbon_price_per_tonne", env=admin)
    assert r.returncode == 0, r.stderr
    shown = json.loads(spotbroker("teams", "policy", "show", "--json", env={**env, "SPOTBROKER_TOKEN": token}).stdout)
    assert "carbon_price_per_tonne" not in shown
