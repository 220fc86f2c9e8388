"""Fixtures of the browser suite: Debian's headless Chromium driven by Playwright against
Django's live server on PostgreSQL, with screenshots saved under ``test-artifacts/``.

PostgreSQL only: the live server answers from its own threads, each with its own
connection, and sees only committed rows (transactional tests), which is what the
product runs on. On SQLite the suite refuses to be collected instead of skipping.
Chromium is Debian's ``/usr/bin/chromium`` (``scripts/test.sh`` installs it); Playwright's
own browser downloads are not used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.helpers import require_postgres

require_postgres("tests/browser", "drives a real browser against the live server")

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1440, "height": 860}
TIMEOUT_MS = 15_000


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item, so the page fixture knows the test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One Chromium per test module.

    Playwright's sync API keeps an asyncio loop in this thread while it runs, and Django
    refuses ORM calls where a loop runs; the tests' own ORM calls (setup, checks) are
    plain synchronous code, so the check is lifted for as long as the browser lives.
    """
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no Chromium at {CHROMIUM}: run scripts/test.sh (it installs Debian's "
                    "chromium) or `apt-get install chromium`, or set CHROMIUM=/path")
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                                  args=CHROMIUM_ARGS)
            try:
                yield chromium
            finally:
                chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def artifacts(request: pytest.FixtureRequest) -> Path:
    """This test's screenshot folder, emptied first: ``test-artifacts/browser/<test>/``."""
    folder = ARTIFACTS / re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.png"):
        old.unlink()
    return folder


@pytest.fixture
def page(browser: Browser, artifacts: Path, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A fresh browser context (no cookies) and page; a screenshot of where it stood is
    saved as ``failure.png`` when the test failed."""
    context = browser.new_context(viewport=VIEWPORT)
    # The admin's navigation sidebar starts collapsed: the lists get the width.
    context.add_init_script("window.localStorage.setItem('django.admin.navSidebarIsOpen', "
                            "'false')")
    context.set_default_timeout(TIMEOUT_MS)
    tab = context.new_page()
    try:
        yield tab
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            try:
                tab.screenshot(path=str(artifacts / "failure.png"), full_page=True)
            except Exception as exc:  # the browser may be what failed
                print(f"no failure screenshot: {exc}")
        context.close()


@pytest.fixture
def shot(page: Page, artifacts: Path) -> Callable[..., Path]:
    """``shot("03-dead-jobs")`` saves the page as it is now; returns the file."""
    taken: list[Path] = []

    def take(name: str, **kwargs: Any) -> Path:
        path = artifacts / f"{name}.png"
        page.screenshot(path=str(path), **kwargs)
        assert path.stat().st_size > 0
        taken.append(path)
        return path

    return take
