"""Reading the gateway's Prometheus text (no process: the text is given)."""

from __future__ import annotations

import pytest

from relaxtrio.fleet.gateway_metrics import Sample, parse_prometheus_text, worker_counters
from relaxtrio.fleet.launch_fleet import gateway_command

TEXT = r'''# HELP smg_worker_requests_total Requests sent to a worker
# TYPE smg_worker_requests_total counter
smg_worker_requests_total{worker="http://127.0.0.1:1001",model="/m"} 4
smg_worker_requests_total{worker="http://127.0.0.1:1002",model="/m"} 2 1733000000000

smg_worker_cb_outcomes_total{worker="http://127.0.0.1:1002",outcome="failure"} 3
smg_worker_cb_outcomes_total{worker="http://127.0.0.1:1002",outcome="success"} 2
smg_worker_errors_total{worker_type="regular",error_type="backend_error"} 1
smg_worker_errors_total{worker_type="regular",error_type="upstream_timeout"} 2
smg_tokio_workers 2
smg_http_responses_total{path="/generate",status_code="200",error_code=""} 6
odd{note="a \"quoted\", comma\\ and\nnewline",worker="http://x:1"} 1e3
'''


def test_samples_labels_and_escapes() -> None:
    samples = parse_prometheus_text(TEXT)
    assert len(samples) == 9
    assert samples[1] == Sample("smg_worker_requests_total",
                                {"worker": "http://127.0.0.1:1002", "model": "/m"}, 2.0)
    assert Sample("smg_tokio_workers", {}, 2.0) in samples
    assert samples[7].labels["error_code"] == ""
    assert samples[8].labels == {"note": 'a "quoted", comma\\ and\nnewline', "worker": "http://x:1"}
    assert samples[8].value == 1000.0


def test_worker_counters_sum_each_figure_over_its_series() -> None:
    assert worker_counters(parse_prometheus_text(TEXT)) == {
        "http://127.0.0.1:1001": {"requests": 4.0, "failures": 0.0},
        "http://127.0.0.1:1002": {"requests": 2.0, "failures": 3.0},
        "": {"errors": 3.0},
    }


@pytest.mark.parametrize("line", ['x{worker="a} 1', "x{worker=a} 1", "x 1.2.3", "lonely"])
def test_malformed_lines_are_refused(line: str) -> None:
    with pytest.raises(ValueError):
        parse_prometheus_text(line)


def test_the_gateway_command_leaves_faults_to_the_fleet() -> None:
    cmd = gateway_command(["http://127.0.0.1:1", "http://127.0.0.1:2"], port=3, metrics_port=4)
    assert cmd[1:4] == ["-m", "smg", "launch"]
    assert cmd[cmd.index("--worker-urls") + 1:][:2] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert cmd[cmd.index("--policy") + 1] == "manual"
    assert cmd[cmd.index("--prometheus-port") + 1] == "4"
    assert {"--disable-retries", "--disable-circuit-breaker", "--no-remove-unhealthy-workers",
            "--disable-worker-overload-protection"} <= set(cmd)
