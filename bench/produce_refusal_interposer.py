"""bench.produce_refusal_clients' interposer: a Kafka-protocol relay between the clients and Tansu
that refuses chosen Produce partitions with a chosen error code, as the proxy's topic quotas do,
and counts what it refused and passed."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from kafka.record import MemoryRecords

from devkit.processes import LOOPBACK, free_port
from kafka_quota_proxy.protocol.api_keys import INIT_PRODUCER_ID, METADATA, PRODUCE
from kafka_quota_proxy.protocol.errors import UnknownApiKey, UnsupportedApiVersion
from kafka_quota_proxy.protocol.headers import (
    frame_request,
    frame_response,
    parse_request_header,
    response_body_offset,
    response_prefix,
)
from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.protocol.produce import produce_acks, refusal
from kafka_quota_proxy.protocol.rewrite import carries_addresses, rewrite_addresses

REFUSAL_MESSAGE = "bench: topic over quota"
INIT_PRODUCER_ID_UPSTREAM = 3  # the oldest InitProducerId version Tansu 0.6.0 answers


@dataclass
class InterposerStats:
    requests: Counter = field(default_factory=Counter)  # api key -> count
    produce_for_topic: int = 0
    forwarded_produce: int = 0
    refused_requests: int = 0
    refused_batches: int = 0
    first_refusal: float | None = None
    metadata_after_refusal: int = 0
    gaps: list[float] = field(default_factory=list)  # refusal -> next send of its records
    produce_versions: Counter = field(default_factory=Counter)
    broken: list[str] = field(default_factory=list)  # protocol surprises
    broker_errors: Counter = field(default_factory=Counter)  # error code -> partition answers
    init_pid_upgraded: int = 0  # InitProducerId v0-v2 sent on as v3 (Tansu workaround)


def _values(records: Any) -> list[bytes]:
    """The record values of one partition's record set (our sequence numbers)."""
    if not records:
        return []
    out: list[bytes] = []
    mem = MemoryRecords(bytes(records))
    while mem.has_next():
        batch = mem.next_batch()
        if batch is None:
            break
        out += [r.value for r in batch]
    return out


async def _read_frame(reader: asyncio.StreamReader) -> bytes | None:
    try:
        prefix = await reader.readexactly(4)
        (size,) = struct.unpack(">i", prefix)
        return prefix + await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


class Interposer:
    """A Kafka-frame relay on its own event loop thread, in front of the broker at `upstream_port`:
    Produce requests naming `topic` are refused with `code` during refusal windows."""

    def __init__(self, upstream_port: int, topic: str, code: int | None, refuse_s: float, pass_s: float):
        self.upstream_port = upstream_port
        self.topic = topic
        self.code = code
        self.refuse_s = refuse_s
        self.pass_s = pass_s
        self.port = free_port()
        self.stats = InterposerStats()
        self._t0: float | None = None
        self._refused_at: dict[bytes, float] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self) -> Interposer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, LOOPBACK, self.port)

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _refusing(self, now: float) -> bool:
        if self.code is None or self._t0 is None:
            return False
        return (now - self._t0) % (self.refuse_s + self.pass_s) < self.refuse_s

    def _mapper(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        return LOOPBACK, self.port

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        try:
            ureader, uwriter = await asyncio.open_connection(LOOPBACK, self.upstream_port)
        except OSError:
            cwriter.close()
            return
        answers: asyncio.Queue[asyncio.Future[bytes]] = asyncio.Queue()
        waiting: deque[tuple[asyncio.Future[bytes], int, int, Any]] = deque()
        tasks = [asyncio.create_task(self._requests(creader, uwriter, answers, waiting)),
                 asyncio.create_task(self._responses(ureader, waiting)),
                 asyncio.create_task(self._answers(answers, cwriter))]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task.exception() is not None:
                self.stats.broken.append(repr(task.exception()))
        for task in pending:
            task.cancel()
        for writer in (cwriter, uwriter):
            writer.close()

    async def _requests(self, creader: asyncio.StreamReader, uwriter: asyncio.StreamWriter,
                        answers: asyncio.Queue[asyncio.Future[bytes]],
                        waiting: deque[tuple[asyncio.Future[bytes], int, int, Any]]) -> None:
        loop = asyncio.get_running_loop()
        while (frame := await _read_frame(creader)) is not None:
            view = memoryview(frame)
            try:
                hdr = parse_request_header(view)
            except (UnknownApiKey, UnsupportedApiVersion):
                # e.g. librdkafka's GetTelemetrySubscriptions (71): forwarded as it is, its
                # answer too (only the header's fixed fields are needed for that)
                api_key, api_version = struct.unpack_from(">hh", view, 4)
                self.stats.requests[api_key] += 1
                fut = loop.create_future()
                waiting.append((fut, api_key, api_version, None))
                answers.put_nowait(fut)
                uwriter.write(frame)
                await uwriter.drain()
                continue
            now = time.monotonic()
            self.stats.requests[hdr.api_key] += 1
            if hdr.api_key == METADATA and self.stats.first_refusal is not None:
                self.stats.metadata_after_refusal += 1
            expects_answer = True
            if (hdr.api_key == INIT_PRODUCER_ID and hdr.api_version < INIT_PRODUCER_ID_UPSTREAM
                    and hdr.spec is not None):
                # Tansu 0.6.0 answers InitProducerId v0-v2 (no producer_id/epoch fields, what
                # aiokafka sends) with UNKNOWN_SERVER_ERROR: sent on as v3 with -1/-1, and the
                # answer turned back into the client's version.
                self.stats.init_pid_upgraded += 1
                request = hdr.spec.request.decode(view[hdr.body_offset:], version=hdr.api_version)
                upgraded = hdr.spec.request(transactional_id=request.transactional_id,
                                            transaction_timeout_ms=request.transaction_timeout_ms,
                                            producer_id=-1, producer_epoch=-1)
                fut = loop.create_future()
                waiting.append((fut, hdr.api_key, hdr.api_version, (hdr.spec, hdr.correlation_id)))
                answers.put_nowait(fut)
                uwriter.write(frame_request(upgraded, INIT_PRODUCER_ID_UPSTREAM, hdr.correlation_id,
                                            hdr.client_id))
                await uwriter.drain()
                continue
            if hdr.api_key == PRODUCE:
                expects_answer = produce_acks(view, hdr.body_offset, hdr.api_version) != 0
                answer = self._produce(view, hdr, now)
                if answer is not None:
                    fut = loop.create_future()
                    fut.set_result(answer)
                    answers.put_nowait(fut)  # in its place in request order
                    continue
            if expects_answer:
                fut = loop.create_future()
                waiting.append((fut, hdr.api_key, hdr.api_version, hdr.spec))
                answers.put_nowait(fut)
            uwriter.write(frame)
            await uwriter.drain()

    def _produce(self, view: memoryview, hdr: Any, now: float) -> bytes | None:
        """The refusal to answer a Produce with, or None to forward it."""
        version = hdr.api_version
        assert hdr.spec is not None
        request = hdr.spec.request.decode(view[hdr.body_offset:], version=version)
        mine = [t for t in request.topic_data if t.name == self.topic]
        if not mine:
            return None
        self.stats.produce_for_topic += 1
        self.stats.produce_versions[version] += 1
        if self._t0 is None:
            self._t0 = now
        batches = [_values(p.records) for t in mine for p in t.partition_data]
        for values in batches:
            refused = [self._refused_at.pop(v) for v in values if v in self._refused_at]
            if refused:
                self.stats.gaps.append(now - max(refused))
        if not self._refusing(now):
            self.stats.forwarded_produce += 1
            return None
        assert self.code is not None
        self.stats.refused_requests += 1
        self.stats.refused_batches += len(batches)
        if self.stats.first_refusal is None:
            self.stats.first_refusal = now
        for values in batches:
            for v in values:
                self._refused_at[v] = now
        body = refusal(request, version, self.code, REFUSAL_MESSAGE, 0)
        return frame_response(hdr.correlation_id, hdr.spec.response_header_version(version), body)

    async def _responses(self, ureader: asyncio.StreamReader,
                         waiting: deque[tuple[asyncio.Future[bytes], int, int, Any]]) -> None:
        while (frame := await _read_frame(ureader)) is not None:
            if not waiting:
                raise RuntimeError("a response for no request")
            fut, api_key, version, spec = waiting.popleft()
            if isinstance(spec, tuple):  # an InitProducerId sent on as v3: back to `version`
                spec, correlation_id = spec
                up = INIT_PRODUCER_ID_UPSTREAM
                body_at = response_body_offset(memoryview(frame), spec.response_header_version(up))
                answer = spec.response.decode(memoryview(frame)[body_at:], version=up)
                back = spec.response(throttle_time_ms=answer.throttle_time_ms, error_code=answer.error_code,
                                     producer_id=answer.producer_id, producer_epoch=answer.producer_epoch)
                body = bytes(back.encode(version=version))
                fut.set_result(frame_response(correlation_id, spec.response_header_version(version), body))
                continue
            if api_key == PRODUCE and spec is not None:
                self._broker_errors(memoryview(frame), version, spec)
            if spec is not None and carries_addresses(api_key, version):
                view = memoryview(frame)
                body_at = response_body_offset(view, spec.response_header_version(version))
                new = rewrite_addresses(api_key, version, view[body_at:], self._mapper)
                if new is not None:
                    body = new.join() if isinstance(new, Pieces) else new
                    frame = response_prefix(view, body_at, len(body)) + body
            fut.set_result(frame)

    def _broker_errors(self, view: memoryview, version: int, spec: Any) -> None:
        """Count the broker's own partition errors for the topic (after a client's answer to a
        refusal, the broker may refuse what it sends next)."""
        body_at = response_body_offset(view, spec.response_header_version(version))
        answer = spec.response.decode(view[body_at:], version=version)
        for topic in answer.responses:
            if topic.name == self.topic:
                for part in topic.partition_responses:
                    if part.error_code:
                        self.stats.broker_errors[part.error_code] += 1

    async def _answers(self, answers: asyncio.Queue[asyncio.Future[bytes]],
                       cwriter: asyncio.StreamWriter) -> None:
        while True:
            frame = await (await answers.get())
            cwriter.write(frame)
            await cwriter.drain()
