"""``edgectl controller run``: the service that drives rollouts and keeps the device registry."""

from __future__ import annotations

import logging
import signal
import threading

import typer

from edgectl.cli.app import app, options
from edgectl.cli.output import console
from edgectl.config import ControllerSettings, load_edgectl_config
from edgectl.connection import checked_broker, controller_transports
from edgectl.controller.store import Store, open_configured
from edgectl.controller.store.protocol import StoreUnavailable
from edgectl.fleet import package_keys
from edgectl.keys import Keyring

log = logging.getLogger(__name__)
RETRY_MAX_S = 5.0

controller_app = typer.Typer(help="The fleet controller service.", no_args_is_help=True)
app.add_typer(controller_app, name="controller")


@controller_app.command("run")
def controller_run(ctx: typer.Context,
                   http: str | None = typer.Option(None, "--http", help="Also serve the REST API, /metrics and the console "
                                                   "on HOST:PORT (e.g. 127.0.0.1:8470; docs/api.md).")) -> None:
    """Ingest device reports and drive every rollout in the store until SIGTERM/Ctrl-C.

    Safe to kill and restart at any point: it continues each rollout from the store
    (config key controller.store; default $EDGECTL_HOME/controller.db). A store that cannot be
    reached, at start or later, is waited for with backoff (docs/reliability.md)."""
    from edgectl.controller.service import Controller

    opts = options(ctx)
    config = load_edgectl_config(opts.config)
    url = checked_broker(opts.broker, config)
    ring = Keyring()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    store = _open_store(config.controller, stopping)
    if store is None:
        return
    service = Controller(store, controller_transports(url, config), ring.signing_key("controller"), package_keys(ring),
                         share_group=config.controller.share_group, webhooks=config.controller.webhooks)
    signal.signal(signal.SIGTERM, lambda *_: service.stop())
    console.print(f"controller: store {store.location()}, broker {url}")
    api = None
    if http is not None:
        from edgectl.api import start_api

        api = start_api(store, config, http, controller=service)
        console.print(f"api: {api.url}/api/v1 (console {api.url}/console/)")
    try:
        service.run()
    except KeyboardInterrupt:
        service.stop()
    finally:
        if api is not None:
            api.stop()


def _open_store(settings: ControllerSettings, stopping: threading.Event) -> Store | None:
    """The configured store, once it answers (None when stopped while waiting for it)."""
    delay, said = 0.5, False
    while True:
        try:
            return open_configured(settings)
        except StoreUnavailable as exc:
            if not said:
                console.print(f"controller: {exc}; waiting for it (retrying with backoff)")
                said = True
            log.debug("store still unavailable: %s", exc)
        if stopping.wait(delay):
            return None
        delay = min(delay * 2, RETRY_MAX_S)
