"""The integration skill (skills/agentic-rollout/) names the doctor's checks as the doctor runs them:
its doctor-checks page lists every check, in the doctor's order, and every check name the skill
cites as evidence is one the doctor has."""

from __future__ import annotations

import re
from pathlib import Path

from relaxtrio.tools.doctor_checks import Observation, evaluate
from relaxtrio.tools.doctor_integration import IntegrationConfig, evaluate_integration

SKILL = Path(__file__).resolve().parents[2] / "skills" / "agentic-rollout"
_NAME = r"`([a-z]+(?:_[a-z]+)*)`"
_CITED = re.compile(rf"^{_NAME}((?:(?:, | / ){_NAME})*)")


def doctor_check_names(tmp_path: Path) -> list[str]:
    """Every check one doctor run reports, in order (an empty observation: each one skips or
    passes, but each is reported)."""
    obs = Observation(log_path=tmp_path / "agent.log")
    checks = evaluate(obs, first_request_s=30, min_client_timeout_s=600, agent_timeout_s=60,
                      reward_hook=None, reward_key=None)
    checks += evaluate_integration(obs, IntegrationConfig(), agent_timeout_s=60, tool_call_parser=None,
                                   reasoning_parser=None)
    return [c.name for c in checks]


def _table_column(text: str, header: str) -> list[str]:
    """The cells of every Markdown table column whose header cell starts with ``header``."""
    cells: list[str] = []
    column = None
    for line in text.splitlines():
        if not line.startswith("|"):
            column = None
            continue
        row = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if column is None:
            column = next((i for i, cell in enumerate(row) if cell.startswith(header)), -1)
        elif column >= 0 and not set(row[column]) <= set("-: "):
            cells.append(row[column])
    return cells


def cited_checks(cell: str) -> list[str]:
    """The check names a cell cites: the backticked names that open it, or open one of its
    ``;``-separated parts (``\\`exit_code\\`, \\`output\\```; ``\\`client_timeout\\` / \\`longest_hold\\` ...``)."""
    names = []
    for part in cell.split(";"):
        found = _CITED.match(part.strip())
        if found:
            names += re.findall(_NAME, found.group(0))
    return names


def test_cited_checks_reads_the_names_that_open_a_cell() -> None:
    assert cited_checks("`exit_code`, `output`") == ["exit_code", "output"]
    assert cited_checks("`client_timeout` / `longest_hold` should prevent it") == ["client_timeout", "longest_hold"]
    assert cited_checks("`export_policy` fails under `strict`; `parsers` shows it") == ["export_policy", "parsers"]
    assert cited_checks("`--save-debug-rollout-data` dump, `forest.leaves`") == []


def test_the_doctor_checks_page_lists_every_check_in_the_doctors_order(tmp_path: Path) -> None:
    page = (SKILL / "reference" / "doctor-checks.md").read_text(encoding="utf-8")
    listed = [name for cell in _table_column(page, "check") for name in cited_checks(cell)]
    assert listed == doctor_check_names(tmp_path)


def test_every_check_the_skill_cites_is_a_doctor_check_and_each_stage_table_cites_them_all(
        tmp_path: Path) -> None:
    names = doctor_check_names(tmp_path)
    cited: list[str] = []
    for path in sorted(SKILL.rglob("*.md")):
        if path.name == "doctor-checks.md":
            continue
        for cell in _table_column(path.read_text(encoding="utf-8"), "doctor"):
            found = cited_checks(cell)
            assert set(found) <= set(names), (path.name, cell)
            cited += found
    assert set(cited) == set(names)
