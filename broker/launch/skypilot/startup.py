"""The SkyPilot launcher in a broker process, set up at start (by broker/background.py)."""
from __future__ import annotations

import threading
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker


def prepare(settings, factory: sessionmaker[Session], launchers: dict,
            hint: Callable[[], None]) -> Callable[[threading.Event], None] | None:
    """With SPOTBROKER_LAUNCHER=skypilot: the launcher joins `launchers`
    (telling the reconciler, through `hint`, whenever SkyPilot says something
    new); returns its janitor's loop, which runs until the event it is given
    is set. None with another launcher."""
    if settings.launcher != "skypilot":
        return None
    from spotbroker.broker.launch.skypilot.janitor import run_janitor
    from spotbroker.broker.launch.skypilot.launcher import SkyPilotLauncher

    launcher = SkyPilotLauncher.from_settings(settings)
    launcher.set_on_change(hint)
    launchers[launcher.name] = launcher

    def janitor(stop: threading.Event) -> None:
        run_janitor(launcher, factory, settings.skypilot_janitor_interval, stop,
                    check_interval=settings.skypilot_check_interval)

    return janitor
