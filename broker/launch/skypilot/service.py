"""Starting the SkyPilot launcher in a broker process (`create_app`)."""
from __future__ import annotations

import threading
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker


def start(settings, factory: sessionmaker[Session], launchers: dict, hint: Callable[[], None],
          stop: threading.Event) -> threading.Thread | None:
    """With SPOTBROKER_LAUNCHER=skypilot: the launcher joins `launchers`
    (telling the reconciler, through `hint`, whenever SkyPilot says something
    new), and its janitor runs until `stop`. Returns the janitor's thread."""
    if settings.launcher != "skypilot":
        return None
    from spotbroker.broker.launch.skypilot.janitor import run_janitor
    from spotbroker.broker.launch.skypilot.launcher import SkyPilotLauncher

    launcher = SkyPilotLauncher.from_settings(settings)
    launcher.set_on_change(hint)
    launchers[launcher.name] = launcher
    janitor = threading.Thread(target=run_janitor, name="skypilot-janitor", daemon=True,
                               args=(launcher, factory, settings.skypilot_janitor_interval, stop),
                               kwargs={"check_interval": settings.skypilot_check_interval})
    janitor.start()
    return janitor
