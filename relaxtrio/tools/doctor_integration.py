"""The doctor's integration checks: what the run's settings make of the agent's one Session.

:mod:`relaxtrio.tools.doctor_checks` checks the agent contract (does the agent start, call the
API, exit, write a usable output). These checks take the same observation together with the
training settings the user intends (:class:`IntegrationConfig`) and answer the questions of the
integration guide (skills/agentic-rollout/): does the export policy accept the history the agent
left, does a multi-context export have a credit function, did the configured parsers leave tool
calls or reasoning in the text, does the external executor have the slots the capacity formula
asks for, and does the client wait as long as a request can be held. Pure, like
:func:`relaxtrio.tools.doctor_checks.evaluate`.
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from .doctor_checks import Check, Observation
from .._errors import ExportError
from ..forest import ResponseNode, select_leaves
from ..rollout.capacity import plan_capacity

INTEGRATION_CHECKS: Final = ("export_policy", "multi_context_credit", "parsers", "capacity", "longest_hold")

TOOL_CALL_MARKUP: Final = (
    ("<tool_call>", "hermes (Qwen2.5, Hermes), qwen3_coder (<function=...> inside), or glm45"),
    ("<function=", "qwen3_coder"),
    ("<|python_tag|>", "llama3"),
    ("<｜tool▁calls▁begin｜>", "deepseekv3 or deepseekv31"),
    ("<|tool_calls_section_begin|>", "kimi_k2"),
    ("[TOOL_CALLS]", "mistral"),
)
"""Text that a tool-call parser would have turned into ``tool_calls``, and the parsers that read it."""
REASONING_MARKUP: Final = ("<think>", "</think>")


@attrs.frozen(kw_only=True)
class IntegrationConfig:
    """The training settings the integration checks compare the agent's run with.

    Attributes:
        export_policy: ``--agentic-export-policy`` (``strict``, ``final``, ``all-leaves``).
        custom_advantage: ``--agentic-custom-advantage-path`` is configured.
        external_slots: ``--agent-external-slots`` (None: no external executor; the check passes
            with a note).
        agentic_concurrency: resident train Groups (``--agentic-concurrency``).
        n_samples_per_prompt: Sessions per train Group.
        eval_group_sizes: ``n_samples_per_eval_prompt`` of each eval dataset (empty: no eval).
        agentic_eval_concurrency: explicit eval Groups, or None for the derived value.
        prelaunch, partial_rollout, fully_async: the flags that keep train Sessions resident
            and let a request wait across a step.
        first_request_timeout_s: training's ``--agent-first-request-timeout`` (0: no limit).
        update_s: how long one update plus weight push takes, in seconds (an estimate).
    """

    export_policy: str = "strict"
    custom_advantage: bool = False
    external_slots: int | None = None
    agentic_concurrency: int = 1
    n_samples_per_prompt: int = 1
    eval_group_sizes: tuple[int, ...] = ()
    agentic_eval_concurrency: int | None = None
    prelaunch: bool = False
    partial_rollout: bool = False
    fully_async: bool = False
    first_request_timeout_s: float = 600.0
    update_s: float = 300.0

    @property
    def cross_step(self) -> bool:
        """A request can wait for a resident slot or across a step."""
        return self.prelaunch or self.partial_rollout or self.fully_async


def _export_policy(obs: Observation, cfg: IntegrationConfig) -> Check:
    if obs.forest is None or not obs.requests:
        return Check("export_policy", "skip", "no request to check")
    if obs.return_code != 0 or obs.output_error is not None:
        return Check("export_policy", "skip", "no usable output")
    if obs.explicit_records:
        return Check("export_policy", "pass",
                     f"explicit export ({obs.explicit_records} record(s)): the policy does not apply")
    leaves = [leaf for leaf in obs.forest.leaves() if leaf.num_responses > 0]
    branched = len(leaves) > 1
    try:
        select_leaves(obs.forest, cfg.export_policy)  # type: ignore[arg-type]
    except ExportError as exc:
        if not leaves:
            return Check("export_policy", "skip", "no reply to export")
        return Check("export_policy", "fail",
                     f"{cfg.export_policy} implicit export refuses this history ({exc.message}; "
                     f"{len(leaves)} leaves with a response): training drops every such Group",
                     "write explicit export records for the contexts to train, or, for a harness "
                     "that resends a turn after a parse error, --agentic-export-policy final "
                     "(all-leaves exports every leaf and needs a custom advantage)")
    if branched and cfg.export_policy == "final":
        return Check("export_policy", "pass",
                     f"final exports the last leaf; {len(leaves) - 1} other branch(es) are not trained")
    return Check("export_policy", "pass",
                 f"{cfg.export_policy}: {len(obs.samples)} context(s) from {len(leaves)} leaf(s)")


def _multi_context_credit(obs: Observation, cfg: IntegrationConfig) -> Check:
    many = len(obs.samples) > 1 or cfg.export_policy == "all-leaves"
    if not obs.samples and cfg.export_policy != "all-leaves":
        return Check("multi_context_credit", "skip", "nothing exported")
    if many and not cfg.custom_advantage:
        why = (f"the Session exported {len(obs.samples)} contexts" if len(obs.samples) > 1
               else "--agentic-export-policy all-leaves exports every leaf")
        return Check("multi_context_credit", "fail",
                     f"{why} and no custom advantage is configured: one reward cannot say how much "
                     "credit each context earns (training drops every such Group)",
                     "configure --agentic-custom-advantage-path (one credit per exported name, "
                     "normalized inside the function) with --use-dynamic-batch-size and "
                     "--max-tokens-per-gpu; or export only the context to train")
    count = len(obs.samples)
    return Check("multi_context_credit", "pass",
                 f"{count} context(s)" + (" with a custom advantage" if many else ": standard reward"))


def _text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _parsers(obs: Observation, tool_call_parser: str | None, reasoning_parser: str | None) -> Check:
    if obs.forest is None:
        return Check("parsers", "skip", "no request to check")
    forest = obs.forest
    nodes = [n for n in forest.nodes() if isinstance(n, ResponseNode)]
    if not nodes:
        return Check("parsers", "skip", "no reply was generated")
    replies = [n.message for n in nodes]
    texts = [_text_of(m) for m in replies]
    # Tool-call markup counts only where the request offered tools: the parser runs only then,
    # and a text-protocol harness (no tools) parses such text itself.
    tooled = [_text_of(n.message) for n in nodes if forest.subtree_root(n).tools]
    for marker, parsers in TOOL_CALL_MARKUP:
        if any(marker in text for text in tooled):
            now = tool_call_parser or "none"
            return Check("parsers", "fail",
                         f"a reply's text holds tool-call markup {marker!r} that the tool-call parser "
                         f"({now}) left as text: the agent sees no tool_calls",
                         f"set --agentic-tool-call-parser to the model's format ({parsers})")
    for marker in REASONING_MARKUP:
        if any(marker in text for text in texts):
            now = reasoning_parser or "none"
            return Check("parsers", "fail",
                         f"a reply's text holds reasoning markup {marker!r} that the reasoning parser "
                         f"({now}) left in content: the agent sees the thinking as its answer",
                         "set --agentic-reasoning-parser to the model's format (qwen3, qwen3-thinking, "
                         "deepseek-r1, deepseek-v3, glm45, kimi_k2, gpt-oss, mistral: "
                         "docs/model-families.md#the-table)")
    calls = sum(len(m.get("tool_calls") or ()) for m in replies)
    reasoning = sum(1 for m in replies if m.get("reasoning_content"))
    return Check("parsers", "pass", f"{len(replies)} replies: {calls} tool call(s) and {reasoning} reasoning "
                                    "block(s) parsed, no markup left in the text")


def _capacity(cfg: IntegrationConfig) -> Check:
    if cfg.external_slots is None:
        return Check("capacity", "pass", "no external executor declared (--agent-external-slots unset)")
    plan = plan_capacity(
        agentic_concurrency=cfg.agentic_concurrency, n_samples_per_prompt=cfg.n_samples_per_prompt,
        eval_group_sizes=[(f"eval{i}", g) for i, g in enumerate(cfg.eval_group_sizes)],
        agentic_eval_concurrency=cfg.agentic_eval_concurrency, prelaunch=cfg.prelaunch,
        partial_rollout=cfg.partial_rollout, fully_async=cfg.fully_async)
    if cfg.external_slots < plan.required:
        return Check("capacity", "fail",
                     f"the executor's {cfg.external_slots} slots are fewer than the {plan.required} "
                     f"required: {plan.describe()}; Groups would deadlock at the first-request barrier",
                     "raise the executor's slot limit, or lower --agentic-concurrency, "
                     "--n-samples-per-prompt or --agentic-eval-concurrency")
    return Check("capacity", "pass", f"{cfg.external_slots} slots >= {plan.required}: {plan.describe()}")


def longest_hold_s(cfg: IntegrationConfig, agent_timeout_s: float) -> float:
    """How long one model request can be held before its answer starts, in seconds.

    The first request waits at the first-request barrier for its Group's other Sessions (at most
    ``first_request_timeout_s``). With prelaunch, partial rollout or fully async it can also wait
    for a resident slot or across a step: one Group's active time (``agent_timeout_s``) plus an
    update and weight push (``update_s``). A barrier without limit (0) makes the hold unbounded
    (``inf``).
    """
    if cfg.first_request_timeout_s <= 0:
        return float("inf")
    hold = cfg.first_request_timeout_s
    if cfg.cross_step:
        hold += agent_timeout_s + cfg.update_s
    return hold


def _longest_hold(obs: Observation, cfg: IntegrationConfig, agent_timeout_s: float) -> Check:
    if not obs.requests:
        return Check("longest_hold", "skip", "no request to check")
    hold = longest_hold_s(cfg, agent_timeout_s)
    why = (f"--agent-first-request-timeout {cfg.first_request_timeout_s:g} s"
           + (f" + --agent-timeout {agent_timeout_s:g} s + update {cfg.update_s:g} s (prelaunch, partial "
              "rollout or fully async)" if cfg.cross_step else ""))
    seen = [r.client_timeout_s for r in obs.requests if r.client_timeout_s is not None]
    if not seen:
        return Check("longest_hold", "pass",
                     f"the client announces no timeout; make sure it waits >= {hold:g} s ({why})")
    if min(seen) < hold:
        return Check("longest_hold", "fail",
                     f"the client gives up after {min(seen):g} s but a request can be held {hold:g} s "
                     f"({why}); a held request would time out and be retried",
                     f"set the client's read timeout above {hold:g} s with no retries, or lower "
                     "--agent-first-request-timeout / turn off cross-step holding")
    return Check("longest_hold", "pass", f"client timeout {min(seen):g} s >= longest hold {hold:g} s ({why})")


def evaluate_integration(obs: Observation, cfg: IntegrationConfig, *, agent_timeout_s: float,
                         tool_call_parser: str | None, reasoning_parser: str | None) -> list[Check]:
    """The integration checks of one agent run, in :data:`INTEGRATION_CHECKS` order.

    Args:
        obs: what the run saw (its forest, requests, output and export).
        cfg: the intended training settings.
        agent_timeout_s: the agent's active-time budget (``--agent-timeout``), seconds.
        tool_call_parser: the tool-call parser the run used (None: none).
        reasoning_parser: the reasoning parser the run used (None: none).
    """
    return [
        _export_policy(obs, cfg),
        _multi_context_credit(obs, cfg),
        _parsers(obs, tool_call_parser, reasoning_parser),
        _capacity(cfg),
        _longest_hold(obs, cfg, agent_timeout_s),
    ]
