"""A client's requests between the socket and their handling (proxy/datapath/intake.py), by
feeding bytes: cut out of reads however the bytes are split, and handled in order, none while a
pause that holds lasts."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import pytest

from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.proxy.datapath.intake import Intake, holds
from kafka_quota_proxy.proxy.datapath.read_gate import Pause
from tests.proxy.conftest import request_frame


def frame(correlation: int) -> bytes:
    return request_frame(16, 0, correlation)  # ListGroups v0


def ids(frames: Sequence[memoryview] | None) -> list[int]:
    """The requests' correlation ids (after the size, the API key and version)."""
    assert frames is not None
    return [struct.unpack_from(">i", f, 8)[0] for f in frames]


def test_requests_come_out_of_reads_however_the_bytes_are_split() -> None:
    intake = Intake(1 << 20)
    data = frame(1) + frame(2) + frame(3)
    assert ids(intake.received(data[:5])) == []  # not one frame whole yet
    assert ids(intake.received(data[5:len(frame(1)) + 3])) == [1]
    assert ids(intake.received(data[len(frame(1)) + 3:])) == [2, 3]


def test_frames_after_a_pause_that_holds_wait_and_come_back_in_order() -> None:
    intake = Intake(1 << 20)
    frames = intake.received(frame(1) + frame(2) + frame(3))
    assert frames is not None
    # The first was handled; it was over its quota, so the connection is muted (THROTTLE): the
    # rest of the read waits, and so does everything read meanwhile, behind it.
    intake.hold(frames[1:])
    assert intake.received(frame(4)) is None
    assert intake.release({Pause.THROTTLE}) == []
    assert ids(intake.release({Pause.INFLIGHT})) == [2, 3, 4]  # the in-flight bound holds none
    assert ids(intake.received(frame(5))) == [5]


def test_only_the_in_flight_bound_alone_lets_frames_already_read_through() -> None:
    assert not holds(set())
    assert not holds({Pause.INFLIGHT})
    for reason in Pause:
        if reason is not Pause.INFLIGHT:
            assert holds({reason})
            assert holds({reason, Pause.INFLIGHT})


def test_a_connection_that_closes_forgets_what_waits() -> None:
    intake = Intake(1 << 20)
    intake.hold(list(intake.received(frame(1) + frame(2)) or ()))
    intake.drop()
    assert intake.release(set()) == []
    assert ids(intake.received(frame(3))) == [3]


def test_bytes_that_are_no_kafka_frame_are_a_protocol_error() -> None:
    intake = Intake(100)
    with pytest.raises(ProtocolError):
        intake.received(b"\x00\x00\x10\x00" + b"x" * 8)  # a frame over max_frame_bytes
