"""The run report (report.html) in a real headless Chromium, its no-data cases, TensorBoard logs, `tidal report`.

The browser test needs Debian's ``chromium`` and ``chromium-driver`` (scripts/setup.sh installs
them when run as root); without them it fails, on purpose, rather than skipping.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from tidal.cli import main
from tidal.telemetry.metrics import MetricsLog
from tidal.telemetry.plots import plot_run, staleness_counts, worker_state_seconds
from tidal.telemetry.report import write_report
from tidal.telemetry.tensorboard import TensorBoardLog

PLOT_IDS = ("plot-reward", "plot-staleness", "plot-workers", "plot-throughput")
SUMMARY = {"heldout_pass1_before": 0.25, "heldout_pass1_after": 0.625, "steps": 6, "trajectories": 48,
           "max_staleness": 2, "max_staleness_seen": 2, "dropped_stale": 3,
           "worker_busy_fraction": 0.8125, "wall_s": 123.45, "heldout_pass1_best": 0.5, "best_step": 4,
           "best_checkpoint": "runs/a/checkpoints/step_000004", "final_checkpoint": "runs/a/checkpoints/step_000006"}
# What the header must show for SUMMARY.
SHOWN = {"heldout_pass1_before": "0.250", "heldout_pass1_after": "0.625", "steps": "6", "trajectories": "48",
         "max_staleness": "2", "max_staleness_seen": "2", "dropped_stale": "3",
         "worker_busy_fraction": "81.2%", "wall_s": "123.5", "heldout_pass1_best": "0.500",
         "best_checkpoint": "runs/a/checkpoints/step_000004", "final_checkpoint": "runs/a/checkpoints/step_000006"}
GUARD = {"kind": "guard", "step": 5, "detector": "pass_crash", "evidence": {"pass_rate": [0.1, 0.0]},
         "action": "restore", "lr_scale": 0.5, "restored_step": 4, "version": 6, "wall_s": 50.5,
         "message": "guard: pass_crash at step 5: training pass rate crashed; restoring"}


def step_record(step: int, hist: dict | None = None) -> dict:
    r = {"kind": "step", "step": step, "wall_s": 10.0 * step, "reward_mean": 0.1 * step, "reward_std": 0.2,
         "pass_rate": 0.1 * step, "gen_tokens_per_s": 900.0 + step, "train_tokens_per_s": 2000.0 - step,
         "step_time_s": 10.0, "dropped_stale": step // 2, "worker_busy_fraction": 0.8,
         "train/loss": 1.0 / step, "train/grad_norm": 0.5, "train/lr": 1e-5}
    if hist is not None:
        r["staleness_hist"] = hist
    return r


def write_run(run_dir, records: list[dict], summary: dict | None = SUMMARY):
    run_dir.mkdir(parents=True, exist_ok=True)
    log = MetricsLog(run_dir / "metrics.jsonl")
    for r in records:
        log.write(r)
    log.close()
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def full_records() -> list[dict]:
    records = [{"kind": "eval", "step": 0, "wall_s": 0.0, "heldout_pass1": 0.25, "label": "before"}]
    for step in range(1, 7):
        records.append(step_record(step, {"0": 4, "1": 3, "2": 1}))
        records.append({"kind": "eval", "step": step, "wall_s": 10.0 * step + 1,
                        "heldout_pass1": 0.25 + 0.0625 * min(step, 4), "label": f"step {step}"})
    records.append(GUARD)
    t = 0.0
    for state, length in [("busy", 8.0), ("wait_weights", 1.0), ("busy", 9.0), ("wait_backpressure", 2.0),
                          ("busy", 30.0), ("idle", 10.0)]:
        records.append({"kind": "worker", "worker": 0, "state": state, "start_s": t, "end_s": t + length})
        records.append({"kind": "worker", "worker": 1, "state": state, "start_s": t + 0.5,
                        "end_s": t + 0.5 + length})
        t += length
    return records


def figure_html(page: str, plot_id: str) -> str:
    match = re.search(rf'<figure id="{plot_id}">.*?</figure>', page, re.S)
    assert match, f"no figure {plot_id}"
    return match.group(0)


# ---- the page in a real browser -------------------------------------------------------------

@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and chromedriver):
        pytest.fail("tests/test_report.py needs Chromium and its driver: run scripts/setup.sh as root, or "
                    "`apt-get install chromium chromium-driver` (found chromium=%s, chromedriver=%s)"
                    % (chromium, chromedriver))
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=chromedriver))
    yield driver
    driver.quit()


def load(driver, path):
    driver.get(path.as_uri())
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_report_renders_in_chromium(browser, tmp_path):
    from selenium.webdriver.common.by import By

    path = write_report(write_run(tmp_path / "run-a", full_records()))
    assert path == tmp_path / "run-a" / "report.html"
    assert load(browser, path) == []
    assert "run-a" in browser.find_element(By.TAG_NAME, "h1").text
    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.closest('figure').id, i.complete, i.naturalWidth, i.alt])")
    assert sorted(i[0] for i in images) == sorted(PLOT_IDS)
    for plot_id, complete, width, alt in images:
        assert complete and width > 0, plot_id
        assert len(alt) > 20, plot_id
    # Self-contained: the page fetched nothing besides itself.
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    for key, text in SHOWN.items():
        assert browser.find_element(By.CSS_SELECTOR, f'#summary td[data-key="{key}"]').text == text
    headline = browser.find_element(By.CSS_SELECTOR, "#summary tr:first-child")
    assert headline.text.startswith("held-out pass@1, best checkpoint (step 4)")
    cells = browser.find_elements(By.CSS_SELECTOR, "#guard td")
    assert [c.text for c in cells] == ["5", "pass_crash", "restore", "0.5", GUARD["message"]]
    alt = browser.find_element(By.CSS_SELECTOR, "#plot-reward img").get_attribute("alt")
    assert "best checkpoint's evaluation (step 4) starred" in alt and "1 guard event (pass_crash at step 5)" in alt


def test_no_data_report_renders_in_chromium(browser, tmp_path):
    from selenium.webdriver.common.by import By

    path = write_report(write_run(tmp_path / "empty", [], summary=None))
    assert load(browser, path) == []
    assert browser.execute_script("return document.images.length") == 0
    for plot_id in PLOT_IDS:
        assert "No data" in browser.find_element(By.ID, plot_id).text
    assert "No summary.json" in browser.find_element(By.ID, "summary").text
    assert browser.find_elements(By.ID, "guard") == []  # no guard events: no table


# ---- without a browser ----------------------------------------------------------------------

def test_report_is_self_contained(tmp_path):
    page = write_report(write_run(tmp_path / "run", full_records())).read_text()
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page and "<link" not in page
    for plot_id in PLOT_IDS:
        assert 'src="data:image/png;base64,' in figure_html(page, plot_id)


def test_missing_data_gives_notes_not_plots(tmp_path):
    # An older, synchronous run: steps without staleness_hist or throughput, no worker spans.
    old = [{k: v for k, v in step_record(s).items() if not k.endswith("tokens_per_s")} for s in (1, 2)]
    page = write_report(write_run(tmp_path / "old", old, summary={"steps": 2})).read_text()
    assert "<img" in figure_html(page, "plot-reward")
    for plot_id in ("plot-staleness", "plot-workers", "plot-throughput"):
        fig = figure_html(page, plot_id)
        assert "<img" not in fig and "No data" in fig, plot_id
    assert 'data-key="steps">2<' in page and 'data-key="wall_s"' not in page


def test_staleness_histogram_sums_steps():
    steps = [step_record(1, {"0": 3, "1": 2}), step_record(2), step_record(3, {"0": 1, "2": 4}),
             step_record(4, {"1": 5, "10": 1})]
    assert staleness_counts(steps) == {0: 4, 1: 7, 2: 4, 10: 1}
    assert list(staleness_counts(steps)) == [0, 1, 2, 10]
    assert staleness_counts([step_record(1)]) == {}


def test_worker_seconds_and_unknown_state():
    spans = [{"kind": "worker", "worker": 1, "state": "busy", "start_s": 0.0, "end_s": 3.0},
             {"kind": "worker", "worker": 1, "state": "idle", "start_s": 3.0, "end_s": 4.0},
             {"kind": "worker", "worker": 0, "state": "busy", "start_s": 1.0, "end_s": 1.5}]
    seconds = worker_state_seconds(spans)
    assert list(seconds) == [0, 1]
    assert seconds[1]["busy"] == 3.0 and seconds[1]["idle"] == 1.0 and seconds[0]["busy"] == 0.5
    with pytest.raises(ValueError, match="sleeping"):
        worker_state_seconds([dict(spans[0], state="sleeping")])


def test_plot_run_writes_png(tmp_path):
    run = write_run(tmp_path / "run", full_records())
    assert plot_run(run).stat().st_size > 1000
    assert plot_run(write_run(tmp_path / "empty", [])).stat().st_size > 1000


def test_tensorboard_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with TensorBoardLog(tmp_path) as tb:
        for r in full_records():
            tb.write(r)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"reward_mean", "train/loss", "train/lr", "gen_tokens_per_s", "eval/heldout_pass1"} <= tags
    assert not tags & {"staleness_hist", "kind", "step", "label", "eval/label", "worker", "state"}
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2, 3, 4, 5, 6]
    assert loss[1].value == pytest.approx(0.5)
    assert [e.step for e in acc.Scalars("eval/heldout_pass1")] == [0, 1, 2, 3, 4, 5, 6]
    assert [(e.step, e.value) for e in acc.Scalars("guard/lr_scale")] == [(5, 0.5)]
    assert [e.step for e in acc.Scalars("guard/pass_crash")] == [5] and "guard/restore" in tags


# ---- `tidal report` -------------------------------------------------------------------------

def test_cli_report(tmp_path, capsys):
    run = write_run(tmp_path / "run", full_records())
    assert main(["report", str(run)]) == 0
    assert capsys.readouterr().out.strip() == str(run / "report.html")
    assert (run / "report.html").stat().st_size > 1000


def test_cli_report_missing_inputs_are_clear_errors(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "error" in (err := capsys.readouterr().err) and str(tmp_path / "nope") in err
    (tmp_path / "bare").mkdir()
    assert main(["report", str(tmp_path / "bare")]) == 2
    assert str(tmp_path / "bare" / "metrics.jsonl") in capsys.readouterr().err
