"""The throttle mute's logic (proxy/datapath/mute.py) on made-up times, as a connection drives it:
when reading may resume after throttles, overlapping or waiting on a response over quota."""

from kafka_quota_proxy.proxy.datapath.mute import Mute


def test_a_throttle_runs_from_when_its_response_went_out() -> None:
    mute = Mute()
    assert mute.start(10.0, 250) == 10.25  # the timer is set for 10.25
    assert mute.may_end()


def test_a_shorter_throttle_within_a_longer_one_sets_no_timer() -> None:
    mute = Mute()
    assert mute.start(10.0, 1000) == 11.0
    assert mute.start(10.5, 400) is None  # ends at 10.9, inside the one to 11.0
    assert mute.start(10.5, 500) is None  # ends at 11.0 exactly: nothing later
    assert mute.start(10.75, 500) == 11.25  # ends later: the timer moves
    assert mute.until == 11.25


def test_the_mute_holds_while_a_response_over_quota_is_still_to_go_out() -> None:
    # A Produce charged over quota on arrival: reading stops at once, but its throttle starts
    # only when its response is written, as on a broker. An earlier throttle's timer firing in
    # between must not resume reading.
    mute = Mute()
    mute.start(0.0, 100)
    mute.charged_over()
    assert not mute.may_end()  # the timer at 0.1 s: still held
    mute.answered()  # the response goes out at 0.3 s with its own throttle
    assert mute.start(0.3, 200) == 0.5
    assert mute.may_end()  # the timer at 0.5 s resumes reading


def test_two_responses_over_quota_both_go_out_before_reading_resumes() -> None:
    mute = Mute()
    mute.charged_over()
    mute.charged_over()
    mute.answered()
    assert not mute.may_end()
    mute.answered()
    assert mute.may_end()
