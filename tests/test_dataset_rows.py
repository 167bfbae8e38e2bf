"""The training set's rows for the whole-run forecast: counted in a local file, read from the datasets cache, or
from the Hub's dataset metadata (here the Hub's API is served by a local HTTP server named by HF_ENDPOINT, as
huggingface_hub itself honours it), cached; never downloaded. And the forecast they give: a whole-run range."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from grpo_launch.probe.dataset import dataset_rows

from .helpers import ROOT, plan_recipe

CARD = {"id": "org/math", "cardData": {"dataset_info": [
    {"config_name": "default",
     "splits": [{"name": "train", "num_examples": 7500}, {"name": "test", "num_examples": 500}]},
    {"config_name": "hard", "splits": [{"name": "train", "num_examples": 1200}]},
]}}  # fmt: skip


@pytest.fixture
def hub():
    """A local stand-in for the Hub's /api/datasets endpoint, counting requests."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # http.server's name
            hits.append(self.path)
            body = json.dumps(CARD).encode() if self.path == "/api/datasets/org/math" else b"{}"
            self.send_response(200 if self.path == "/api/datasets/org/math" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()


def test_rows_come_from_the_hubs_metadata_once_then_from_the_cache(hub, tmp_path):
    endpoint, hits = hub
    env = {"HF_ENDPOINT": endpoint, "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}
    assert dataset_rows({"dataset_name": "org/math"}, str(tmp_path), env) == (7500, "the Hub's dataset metadata")
    assert dataset_rows({"dataset_name": "org/math", "dataset_config": "hard"}, str(tmp_path), env)[0] == 1200
    assert dataset_rows({"dataset_name": "org/math"}, str(tmp_path), env) == (
        7500, "the Hub's dataset metadata (cached)")  # fmt: skip
    assert hits == ["/api/datasets/org/math"] * 2  # the cached answer asked nothing
    rows, why = dataset_rows({"dataset_name": "org/nothing"}, str(tmp_path), env)
    assert rows is None and "no metadata for org/nothing (HTTP 404)" in why
    down = {**env, "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens: not asked again for an hour
    assert "could not be asked" in dataset_rows({"dataset_name": "org/x"}, str(tmp_path), down)[1]
    assert "unreachable within the last 60 min" in dataset_rows({"dataset_name": "org/y"}, str(tmp_path), down)[1]
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    rows, why = dataset_rows({"dataset_name": "org/other"}, str(tmp_path), offline)
    assert rows is None and "offline" in why and len(hits) == 3


def test_rows_come_from_a_local_file_and_the_datasets_cache(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"}\n\n{"prompt": "c"}\n')
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)}
    assert dataset_rows({"dataset_name": "train.jsonl"}, str(tmp_path), env) == (3, "counted in train.jsonl")
    # what `datasets` writes when it has prepared a Hub dataset: NAMESPACE___NAME/CONFIG/VERSION/HASH/
    info = tmp_path / "hf" / "datasets" / "AI-MO___NuminaMath-TIR" / "default" / "0.0.0" / "abc123"
    info.mkdir(parents=True)
    (info / "dataset_info.json").write_text(json.dumps({"splits": {"train": {"name": "train", "num_examples": 72441}}}))
    assert dataset_rows({"dataset_name": "AI-MO/NuminaMath-TIR"}, str(tmp_path), env) == (72441, "the datasets cache")


def test_an_epoch_based_recipe_prints_a_whole_run_range_or_why_not():
    """The shipped recipes train num_train_epochs: 1: with the rows, the whole run is a range from the expected
    mean completion length (a stated prior) to every completion at the maximum; without them, one line says why."""
    from grpo_launch.cli.tables import plan_sections

    recipe = ROOT / "recipes" / "qwen7b-math.yaml"
    plan = plan_recipe(recipe, "8xH100-80GB", "launch.dataset_rows=7500")
    total = plan.estimate.total
    assert total is not None and total.hours_expected < total.hours
    assert "prior 60%" in total.expected_source and "TRL #5697" in total.expected_source
    shown = {row[0]: row[1] for section in plan_sections(plan) for row in section.rows if len(row) == 2}
    assert "–" in shown["whole run"] and " h, " in shown["whole run"] and "prior 60%" in shown["  range"]
    set_len = plan_recipe(recipe, "8xH100-80GB", "launch.expected_completion_length=600")
    assert "launch.expected_completion_length" in set_len.estimate.total.expected_source
    assert set_len.estimate.total.hours == pytest.approx(total.hours)  # the high end does not move
    shipped = plan_recipe(recipe, "8xH100-80GB").estimate.total  # the recipe gives MATH's 7,500 rows itself
    assert shipped is not None and shipped.steps == total.steps
    missing = plan_recipe(ROOT / "recipes" / "qwen1.5b.yaml", "8xH100-80GB").estimate  # rows from the Hub only
    assert missing.total is None and "launch.dataset_rows" in missing.total_missing
