"""A real browser draws a request's explanation as a heat map over its 8x8 image: digits with ``explain:`` and
lineage on, the explain side branch running, and the page's lineage look-up (headless Chromium via Selenium,
as test_ui_browser.py; the screenshot is copied to /tmp/ui-explain.png)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path

import pytest

from flowserve.capture import capture_hooks
from flowserve.capture.lineage import explanations
from flowserve.cli.ui import sources
from flowserve.client import TopologyClient
from flowserve.client.traffic import wait_ready
from flowserve.explain.service import Explainer
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology_text
from flowserve.ui import UiServer, UiSettings

pytest.importorskip("captum")
pytest.importorskip("flowserve_components")
pytestmark = pytest.mark.external  # headless Chromium and chromedriver from Debian

DIGITS = """
name: NAME
partitions: 2
nodes:
  pre: {component: "flowserve_components.digits:Normalize", inputs: {pixels: input.pixels}}
  model:
    component: flowserve_components.torch_stage:TorchClassifier
    params: {model: digits-mlp, threads: 1}
    inputs: {x: pre.x}
  post: {component: "flowserve_components.postprocess:ArgMax", inputs: {logits: model.logits}}
outputs: {label: post.label, probs: post.probs}
explain: {sample: 1.0}
capture: {sample: 1.0, lineage: true, tracing: false}
"""


def _drive(url: str, request_id: str, shot: Path) -> list[float]:
    """Look the request up on the page; the heat map's cell values (blocking: runs in a thread)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver_path = shutil.which("chromedriver")
    if not binary or not driver_path:
        pytest.skip("no Chromium and chromedriver on PATH (Debian: apt-get install -y chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1400"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.get(url)
        wait = WebDriverWait(driver, 60, poll_frequency=0.25)
        wait.until(lambda d: d.find_elements(By.ID, "request-id"))
        driver.find_element(By.ID, "request-id").send_keys(request_id)
        driver.find_element(By.CSS_SELECTOR, "#lineage-form button[type=submit]").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".explanation .heatmap .cell"))
        cells = driver.find_elements(By.CSS_SELECTOR, ".explanation .heatmap .cell")
        driver.find_element(By.CSS_SELECTOR, ".explanation").location_once_scrolled_into_view  # noqa: B018
        driver.save_screenshot(str(shot))
        return [float(c.get_attribute("data-value") or "nan") for c in cells]
    finally:
        driver.quit()


async def test_a_browser_draws_a_requests_explanation_as_a_heat_map(kafka, unique_name, tmp_path) -> None:  # noqa: ANN001
    from flowserve_components.digits import sample

    topology = load_topology_text(DIGITS.replace("NAME", unique_name))
    (request,), _ = sample(1, seed=17)
    explainer = Explainer(topology, kafka)
    shot = tmp_path / "ui-explain.png"
    async with InlineHost(topology, kafka, hooks=capture_hooks):
        task = asyncio.create_task(explainer.run())
        try:
            async with TopologyClient(topology, kafka) as client:
                await wait_ready(client, request)
                reply = await client.call(request, request_id="heat-1")
            assert reply.error is None
            async with asyncio.timeout(120):
                while not (found := await explanations(kafka, "heat-1", unique_name)):
                    await asyncio.sleep(0.2)  # polling for the side branch's record, bounded
            async with UiServer([topology], sources(kafka), UiSettings(port=0, poll_s=0.5)) as ui:
                values = await asyncio.to_thread(_drive, ui.url, "heat-1", shot)
        finally:
            explainer.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
    assert len(values) == 64  # one cell per pixel of the 8x8 image
    assert values == pytest.approx(found[0]["attributions"]["pixels"]["data"], rel=1e-6)
    assert shot.stat().st_size > 10_000
    shutil.copyfile(shot, "/tmp/ui-explain.png")
