"""What the reconciler's tests share: a database seeded with the bundled
offers and one team (`submit`, in helpers, stores a job in it)."""
from __future__ import annotations

import pytest

from spotbroker.broker import auth
from spotbroker.broker.pricing.offers import seed_from_catalog
from spotbroker.broker.store.db import transaction


@pytest.fixture
def env(factory, settings, agent_endpoint):
    """(session factory, settings, the team `ml`'s id), the catalog's offers seeded."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with transaction(factory) as s:
        seed_from_catalog(s)
        team, _ = auth.create_team(s, "ml")
    return factory, settings, team.id
