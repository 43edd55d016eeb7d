"""A real headless Chromium (Debian's chromium and chromium-driver) driven by Selenium, for the web console.

Never downloads a browser: it runs /usr/bin/chromium through /usr/bin/chromedriver, with a fresh
profile directory and the network features that phone home turned off.
"""

from __future__ import annotations

import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

__all__ = ["CHROMEDRIVER", "CHROMIUM", "Browser", "missing"]

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--window-size=1280,860")


def missing() -> str | None:
    """Why the browser cannot start here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.exists():
            return f"{path} is missing: ./scripts/test installs it when root (apt-get install chromium chromium-driver)"
    return None


def _whole_address_space() -> None:
    """In chromedriver's child, before it runs: no address-space cap inherited from the test process (an in-process
    inference server sets one, agent/serving/memory.py); Chromium reserves far more than it uses and dies under one."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def _start_driver(options: webdriver.ChromeOptions, log: Path) -> webdriver.Chrome:
    """Start chromedriver and its browser; when it dies at start, its own log ends the error."""
    service = Service(str(CHROMEDRIVER), log_output=str(log), popen_kw={"preexec_fn": _whole_address_space})
    try:
        return webdriver.Chrome(options=options, service=service)
    except WebDriverException as exc:
        tail = log.read_text(errors="replace")[-2000:] if log.is_file() else "(no log)"
        raise WebDriverException(f"{exc.msg}; chromedriver's log ends: {tail}") from exc


class Browser:
    """One Chromium session; ``base`` is the console's URL (``http://127.0.0.1:PORT/console/``); certificates no CA of
    the system's signed are taken only with ``accept_insecure_certs`` (a provider with a test CA, tests/sso)."""

    def __init__(self, base: str, poll_ms: int = 500, accept_insecure_certs: bool = False) -> None:
        self.base = base
        self.poll_ms = poll_ms
        self.profile = Path(tempfile.mkdtemp(prefix="edgectl-chromium-"))
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in (*FLAGS, f"--user-data-dir={self.profile}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # page errors go into a failing test's message
        options.set_capability("acceptInsecureCerts", accept_insecure_certs)  # a test's own CA (tests/sso)
        self.driver = _start_driver(options, self.profile / "chromedriver.log")
        self.driver.set_page_load_timeout(60)
        self.driver.set_script_timeout(60)

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)

    # -- navigation -----------------------------------------------------------------------------

    def open(self, route: str = "/", ready: str | None = None) -> None:
        """Load the console at ``#route`` (live updates every ``poll_ms``); wait until page ``ready`` has drawn."""
        self.driver.get("about:blank")  # a new document even when only the #route differs
        self.driver.get(f"{self.base}?poll={self.poll_ms}#{route}")
        if ready:
            self.ready(ready)

    def go(self, route: str, ready: str | None = None) -> None:
        """Follow an in-app link (no reload): the hash changes, the console draws the page."""
        self.driver.execute_script("document.body.dataset.ready = ''; location.hash = arguments[0];", route)
        if ready:
            self.ready(ready)

    def ready(self, page: str, timeout: float = 30) -> None:
        self.wait(lambda: self.driver.execute_script("return document.body.dataset.ready") == page, timeout, f"page {page}")

    def sign_in(self, token: str, ready: str = "fleet") -> None:
        self.open("/signin", ready="signin")
        self.css("#token").send_keys(token)
        self.click("#signin")
        self.ready(ready)

    def sign_out(self) -> None:
        self.click("#signout")
        self.ready("signin")

    # -- elements -------------------------------------------------------------------------------

    def css(self, selector: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, selector)

    def all(self, selector: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, selector)

    def text(self, selector: str) -> str:
        """The element's text, retried while live updates replace it."""
        def read() -> str | None:
            try:
                return str(self.css(selector).text)
            except (StaleElementReferenceException, WebDriverException):
                return None
        return str(self.wait(lambda: read() is not None and read(), 10, f"text of {selector}"))

    def enabled(self, selector: str) -> bool:
        """Whether the element is an enabled control, read in one script (live updates may replace it any time)."""
        return bool(self.js("const el = document.querySelector(arguments[0]); if (!el) throw new Error('no ' + arguments[0]);"
                            " return !el.disabled;", selector))

    def attributes(self, selector: str, name: str) -> list[str]:
        """Attribute ``name`` of every element matching ``selector``, read in one script."""
        return [str(v) for v in self.js("return [...document.querySelectorAll(arguments[0])].map((el) => el.getAttribute("
                                        "arguments[1]));", selector, name)]

    def click(self, selector: str) -> None:
        self.wait(lambda: self._click(selector), 10, f"clicking {selector}")

    def _click(self, selector: str) -> bool:
        try:
            self.css(selector).click()
            return True
        except (StaleElementReferenceException, WebDriverException):
            return False

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def fetch(self, method: str, path: str, body: Any = None) -> int:
        """An API call from the page with the signed-in token; returns the HTTP status."""
        return int(self.driver.execute_async_script(
            "const [method, path, body, done] = arguments;"
            "fetch('/api/v1' + path, {method, headers: {Authorization: 'Bearer ' + sessionStorage.getItem('edgectl.token'),"
            " 'Content-Type': 'application/json'}, body: body === null ? undefined : JSON.stringify(body)})"
            ".then((r) => done(r.status), () => done(0));", method, path, body))

    def wait(self, condition: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = condition()
            except StaleElementReferenceException:
                value = None
            if value:
                return value
            time.sleep(0.1)
        flash = self.js("const f = document.getElementById('flash'); return f && !f.hidden ? f.textContent : ''")
        raise AssertionError(f"timed out after {timeout}s waiting for {what} (page {self.driver.current_url}; flash {flash!r};"
                             f" console {self.console_log()})")

    def console_log(self) -> list[str]:
        """What the page logged (errors included) since the last call."""
        try:
            entries: list[dict[str, Any]] = self.driver.get_log("browser")  # type: ignore[no-untyped-call]
            return [str(entry.get("message", "")) for entry in entries]
        except WebDriverException:
            return []

    def screenshot(self, path: Path) -> None:
        """The whole page (up to 1600 px high) as a PNG."""
        path.parent.mkdir(parents=True, exist_ok=True)
        size = self.driver.get_window_size()
        height = int(self.js("return document.documentElement.scrollHeight"))
        self.driver.set_window_size(size["width"], min(1600, max(size["height"], height + 140)))
        try:
            time.sleep(0.3)
            self.driver.save_screenshot(str(path))
        finally:
            self.driver.set_window_size(size["width"], size["height"])
