"""A real agent fetching from hostile HTTP sources: it is neither steered (redirects) nor stalled (drips, 1xx).

Issue 27 found a 302 from a signed URL followed to an internal address (a blind SSRF from the
device's position), a redirect to ``gopher://`` sent as HTTP, and sources that drip a byte every
2 s or send ``100 Continue`` forever holding the download until a newer desired state, past
``download_deadline_s``. Each case is a signed desired state naming hostile URLs; the in-process
controller serves MQTT chunks unless the case says not to.
"""

from __future__ import annotations

from collections.abc import Callable

from edgectl.package import Package
from tests.adversarial.hostile import HostileOrigin, continue_forever, drip, recorder, redirect
from tests.deploy.conftest import controller, home  # noqa: F401  (fixtures used here)
from tests.deploy.controller import Controller
from tests.deploy.test_rejections import serves
from tests.fleet import AgentProcess, EdgectlHome
from tests.http.conftest import DEPLOY, big_package, desire  # noqa: F401  (fixture used here)

# Tight limits so that a stall shows in seconds: a head within 2 s, a 16 KiB chunk at 64 KiB/s after that.
FAST = {**DEPLOY, "http_timeout_s": 2.0, "http_min_bytes_per_s": 65536}


def _fallback_event(ctl: Controller, deployment: str) -> str:
    details = [e.detail for e in ctl.events if e.deployment_id == deployment and e.state == "download"
               and (e.data or {}).get("source") == "mqtt"]
    assert details, "no event said why the download fell back to MQTT"
    return details[0]


def test_no_source_steers_or_stalls_the_device_and_mqtt_brings_the_artifact(
        home: EdgectlHome, controller: Controller,  # noqa: F811
        agents: Callable[..., AgentProcess], big_package: Package,  # noqa: F811
        origins: Callable[..., HostileOrigin]) -> None:
    """Four hostile URLs in one signed desired state: two redirects (to an internal service, to gopher), a drip and
    endless ``100 Continue``. The device refuses or cuts each, says why in one event, and installs over MQTT."""
    agent = agents(home, "x-1", extra={"deploy": FAST})
    internal = origins(recorder)  # an admin service only the device's network position reaches
    to_internal = origins(redirect(f"{internal.url}/internal/admin?delete=all"))
    to_gopher = origins(redirect(f"gopher://127.0.0.1:{internal.url.rsplit(':', 1)[1]}/_DELETE%20ALL"))
    dripping = origins(drip(big_package.payload.read_bytes(), every_s=1.0))
    continuing = origins(continue_forever(every_s=0.5))
    urls = [f"{o.url}/p" for o in (to_internal, to_gopher, dripping, continuing)]
    deployment = desire(controller, "x-1", big_package, urls)
    # Unbounded, the drip alone would take hours (a byte a second) and 100 Continue forever.
    assert controller.final("x-1", deployment, timeout=150).status == "ok"
    assert serves(agent, "big", 1)
    assert internal.heads == [], f"the device was steered to an internal service: {internal.heads[:1]}"
    assert len(to_internal.heads) == 1 and len(to_gopher.heads) == 1  # one request each: a refusal is not retried
    why = _fallback_event(controller, deployment)
    assert "redirect refused: to http://127.0.0.1:" in why and "neither the origin of a signed URL" in why
    assert "redirect refused: to a gopher: URL (only http and https are followed)" in why
    assert "stalled: chunk 0 (16384 bytes) took over 2 s (slower than 65536 B/s)" in why
    assert "stalled: no response head within 2 s" in why
    assert "delete=all" not in why  # URLs in events and logs go without their query


def test_the_download_deadline_bounds_http(home: EdgectlHome, controller: Controller,  # noqa: F811
                                           agents: Callable[..., AgentProcess], big_package: Package,  # noqa: F811
                                           origins: Callable[..., HostileOrigin]) -> None:
    """A source just fast enough never to count as stalled (1 B/s here) still ends at download_deadline_s."""
    agents(home, "x-3", extra={"deploy": {**FAST, "http_min_bytes_per_s": 1, "download_deadline_s": 6}})
    controller.serving = False  # no MQTT chunks either: the deadline alone must end the download
    dripping = origins(drip(big_package.payload.read_bytes(), every_s=0.5))
    deployment = desire(controller, "x-3", big_package, [f"{dripping.url}/p"])
    final = controller.final("x-3", deployment, timeout=150)  # unbounded: three days at 2 B/s
    assert final.status == "failed" and "download did not complete within 6s" in final.detail, final.detail
    assert "the download's deadline passed" in _fallback_event(controller, deployment)
