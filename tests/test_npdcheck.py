"""The node-problem-detector check: the plugin protocol's exit statuses on the verdicts document,
and the shipped NPD configuration as node-problem-detector reads it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from exporter import npdcheck

ROOT = Path(__file__).resolve().parent.parent
NPD = ROOT / "deploy" / "node-problem-detector" / "nvgpu-verdicts.json"


def doc(*verdicts: str, version: int = 1) -> dict[str, Any]:
    gpus = [{"gpu": str(i), "verdict": v, "cause": f"cause{i}"} for i, v in enumerate(verdicts)]
    return {"schema_version": version, "gpus": gpus}


@pytest.mark.parametrize(
    ("verdicts", "bar", "code"),
    [
        (("ok", "ok"), "stop_scheduling", npdcheck.OK),
        (("ok", "watch"), "stop_scheduling", npdcheck.OK),
        (("ok", "stop_scheduling"), "stop_scheduling", npdcheck.NON_OK),
        (("reset_gpu", "ok"), "stop_scheduling", npdcheck.NON_OK),
        (("reset_gpu", "ok"), "reboot_node", npdcheck.OK),
        (("reboot_node",), "reboot_node", npdcheck.NON_OK),
        (("ok", "fix_exporter"), "stop_scheduling", npdcheck.UNKNOWN),  # never NonOK for the exporter's pod
        (("fix_exporter", "reboot_node"), "stop_scheduling", npdcheck.NON_OK),
        ((), "stop_scheduling", npdcheck.UNKNOWN),
    ],
)
def test_exit_status_follows_the_plugin_protocol(verdicts: tuple[str, ...], bar: str, code: int) -> None:
    assert npdcheck.evaluate(doc(*verdicts), bar)[0] == code


def test_an_unknown_schema_is_unknown() -> None:
    assert npdcheck.evaluate(doc("ok", version=2), "stop_scheduling")[0] == npdcheck.UNKNOWN
    assert npdcheck.evaluate(["not", "a", "document"], "stop_scheduling")[0] == npdcheck.UNKNOWN


def test_the_message_names_the_worst_gpu_and_fits_npds_output_length(capsys: pytest.CaptureFixture[str]) -> None:
    code, message = npdcheck.evaluate(doc("stop_scheduling", "reboot_node", "reset_gpu"), "stop_scheduling")
    assert code == npdcheck.NON_OK and message == "GPU 1 reboot_node: cause1 +2 GPU(s)"


def test_an_exporter_that_does_not_answer_is_unknown_within_the_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    assert npdcheck.run("http://127.0.0.1:9/api/v1/verdicts", 0.5, "stop_scheduling") == npdcheck.UNKNOWN
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and len(line.rstrip("\n")) <= npdcheck.MAX_OUTPUT and "not answering" in line


def _duration_s(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", text)
    assert m, text
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[m.group(2)]


def test_the_shipped_npd_config_is_what_node_problem_detector_accepts() -> None:
    """The checks node-problem-detector's CustomPluginConfig.Validate makes (plugin "custom", rule
    timeouts within the global one, a default condition for every permanent rule), plus ours: each
    rule runs npd-check with a --timeout below its own, and a --min-verdict the check knows."""
    config = json.loads(NPD.read_text())
    assert config["plugin"] == "custom"
    glob = config["pluginConfig"]
    assert glob["max_output_length"] == npdcheck.MAX_OUTPUT
    conditions = {c["type"] for c in config["conditions"]}
    for rule in config["rules"]:
        assert rule["type"] in ("permanent", "temporary")
        assert rule["type"] != "permanent" or rule["condition"] in conditions
        assert _duration_s(rule["timeout"]) <= _duration_s(glob["timeout"])
        args = rule["args"]
        assert args[0] == "npd-check" and rule["path"].endswith("/nvgpu-exporter")
        assert float(args[args.index("--timeout") + 1]) < _duration_s(rule["timeout"])
        assert args[args.index("--min-verdict") + 1] in npdcheck.RANK
