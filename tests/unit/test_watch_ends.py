"""How the informer takes a watch the server ended by itself (machinery/informer.py)."""

from __future__ import annotations

from mpijob_elastic.machinery.informer import SHORT_WATCH_SECONDS, cut_short


def test_a_quiet_watch_the_server_ends_after_a_few_seconds_is_routine() -> None:
    # A loaded API server ended the one quiet watch after 0.9-35 s at the start of every
    # bench run; each end warned and backed off while anything under half the watch's
    # timeout (minutes) counted as cut short.
    assert not cut_short(4.2, progressed=False)
    assert not cut_short(35.3, progressed=False)


def test_a_watch_ended_at_once_with_nothing_on_it_backs_off() -> None:
    assert cut_short(SHORT_WATCH_SECONDS / 2, progressed=False)
    assert not cut_short(SHORT_WATCH_SECONDS / 2, progressed=True)
