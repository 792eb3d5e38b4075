"""Which signals stop a training run, and the exit code each gives."""

from __future__ import annotations

import signal

import pytest

from relaxtrio.cli.main import _exit_code, _stop_signals, _Terminated


def test_ctrl_c_stops_a_run_through_the_signal_receiver_unless_it_is_ignored() -> None:
    previous = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        assert set(_stop_signals()) == {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job of a script
        assert set(_stop_signals()) == {signal.SIGTERM, signal.SIGHUP}
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize(("signum", "code", "message"), [
    (signal.SIGINT, 130, "interrupted; agents and the engine were stopped"),
    (signal.SIGTERM, 143, "terminated by SIGTERM; agents and the engine were stopped"),
])
def test_each_stop_signal_has_its_exit_code(signum: int, code: int, message: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    group = BaseExceptionGroup("run", [_Terminated(signum)])
    assert _exit_code(group) == code
    assert caplog.records[-1].getMessage() == message
