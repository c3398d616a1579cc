"""`retrying` (broker/store/db.py): work taken again from a fresh read when
another writer got there first, or when PostgreSQL ended it to break a
deadlock with one. The reconciler's record of a launch (its handle) lost
such a deadlock to the nodes' first reports, and the job never ended."""
from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from spotbroker.broker import auth
from spotbroker.broker.store.db import CONFLICT_TRIES, retrying, transaction
from spotbroker.broker.store.models import Team


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_the_victim_of_a_deadlock_is_tried_again(factory):
    with transaction(factory) as s:
        a, _ = auth.create_team(s, "a")
        b, _ = auth.create_team(s, "b")
        ids = (a.id, b.id)
    both_hold_one = threading.Barrier(2, timeout=10)
    tries = {"first": 0, "second": 0}

    def lock_both(name: str, order: tuple[int, int]):
        def work(session):
            tries[name] += 1
            for i, team_id in enumerate(order):
                session.scalars(select(Team).where(Team.id == team_id).with_for_update()).one()
                if i == 0 and tries[name] == 1:
                    both_hold_one.wait()  # each holds one row and asks for the other's: a deadlock
            return name
        return work

    results: dict[str, str] = {}
    threads = [threading.Thread(target=lambda n=n, o=o: results.update({n: retrying(factory, lock_both(n, o))}))
               for n, o in (("first", ids), ("second", ids[::-1]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {"first": "first", "second": "second"}  # both done: the victim tried again
    # The victim's second try may still meet the winner (PostgreSQL does not queue a fresh
    # transaction behind the one it is waking for a row), so both may be tried twice.
    assert max(tries.values()) >= 2 and max(tries.values()) <= CONFLICT_TRIES
