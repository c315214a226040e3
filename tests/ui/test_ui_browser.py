"""A real browser on the page of a running digits deployment under traffic: headless Chromium (Debian's
``chromium`` and ``chromium-driver``, driven by Selenium) finds every node with live figures that change,
looks up a request's lineage by the 12 characters ``flowserve run --sample`` prints, and saves a
screenshot (also copied to /tmp/ui-screenshot.png)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from pydantic import SecretStr
from ui_deploy import running_digits, until

from flowserve.cli.ui import sources
from flowserve.ui import UiServer, UiSettings

pytestmark = pytest.mark.external  # headless Chromium and chromedriver from Debian
NODES = ("pre", "model", "post", "input_drift")
TOKEN = "browser-token"  # noqa: S105 - a test token


def _browser() -> tuple[str, str]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip("no Chromium and chromedriver on PATH (Debian: apt-get install -y chromium chromium-driver)")
    return binary, driver


def _drive(url: str, request_id: str, shot: Path) -> dict[str, list[str]]:
    """The browser session (blocking; runs in a thread while the deployment keeps serving)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    binary, driver_path = _browser()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1700,1300"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.get(f"{url}/#token={TOKEN}")
        wait = WebDriverWait(driver, 90, poll_frequency=0.25)

        def figures(node: str) -> str:
            return " | ".join(t.text for t in driver.find_elements(
                By.CSS_SELECTOR, f'g.node[data-node="{node}"] text.figs'))

        wait.until(lambda d: all("consumer(s)" in figures(n) for n in NODES))
        seen = {n: [figures(n)] for n in NODES}
        wait.until(lambda d: all(figures(n) != seen[n][0] for n in NODES))  # the page updated without a reload
        for n in NODES:
            seen[n].append(figures(n))
            health = driver.find_element(By.CSS_SELECTOR, f'g.node[data-node="{n}"]').get_attribute("data-health")
            seen[n].append(health or "")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#drift .chart"))
        box = driver.find_element(By.ID, "request-id")
        box.send_keys(request_id[:12])
        driver.find_element(By.CSS_SELECTOR, "#lineage-form button[type=submit]").click()
        wait.until(lambda d: d.find_elements(By.ID, "lineage-rid"))
        seen["lineage"] = [driver.find_element(By.ID, "lineage-rid").text,
                           *sorted(g.get_attribute("data-node") or ""
                                   for g in driver.find_elements(By.CSS_SELECTOR, "g.node.on-path"))]
        seen["charts"] = [str(len(driver.find_elements(By.CSS_SELECTOR, "#charts .chart polyline")))]
        driver.save_screenshot(str(shot))
        driver.execute_script("document.getElementById('drift-panel').scrollIntoView()")
        driver.save_screenshot(str(shot.with_name("ui-drift.png")))
        return seen
    finally:
        driver.quit()


async def test_a_browser_sees_every_node_live_and_draws_a_requests_lineage(kafka, unique_name, tmp_path) -> None:
    _browser()
    settings = UiSettings(port=0, poll_s=0.5, tokens=(SecretStr(TOKEN),))
    shot = tmp_path / "ui.png"
    async with running_digits(kafka, unique_name) as deployment, \
            UiServer([deployment.topology], sources(kafka), settings) as ui:
        async def replied() -> bool:
            return bool(deployment.request_ids)

        await until(replied, what="a first reply")
        seen = await asyncio.to_thread(_drive, ui.url, deployment.request_ids[0], shot)
    for n in NODES:
        before, after, health = seen[n]
        assert before != after and "ok " in after, seen[n]
        assert " mJ/req" in after, seen[n]  # energy metered (flowserve run --energy): per answered request
        assert health in ("ok", "lagging"), seen[n]
    assert seen["lineage"] == [deployment.request_ids[0], "input", *sorted(("outputs", *NODES))]
    assert int(seen["charts"][0]) == 4 * len(NODES)  # rate, p99, lag, batch size per node
    assert shot.stat().st_size > 10_000
    shutil.copyfile(shot, "/tmp/ui-screenshot.png")
    shutil.copyfile(shot.with_name("ui-drift.png"), "/tmp/ui-screenshot-drift.png")
