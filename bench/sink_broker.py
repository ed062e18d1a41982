"""A broker that costs next to nothing: every answer is encoded once and replayed, so a workload
through the proxy measures the proxy, not the broker (bench.workers: does `--workers 2` scale?).

    python -m bench.sink_broker --port PORT [--topic T] [--partitions N]

It answers ApiVersions, Metadata (one broker, itself; one topic of N partitions, whatever was
asked) and Produce (success for partition 0 of the topic), each at the version asked, with the
request's correlation id patched into a response encoded at first use. Anything else closes the
connection. Tansu spends 1.1-1.4 cores where the proxy spends 0.3 (docs/performance.md), so behind
Tansu two workers would only wait for it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from collections.abc import Sequence

from kafka.protocol.metadata.api_versions import ApiVersionsResponse
from kafka.protocol.metadata.metadata import MetadataResponse
from kafka.protocol.producer.produce import ProduceResponse

from bench.load import asyncio_run
from kafka_quota_proxy.protocol.headers import frame_response

API_VERSIONS, METADATA, PRODUCE = 18, 3, 0
VERSIONS = {PRODUCE: (0, 9), METADATA: (0, 12), API_VERSIONS: (0, 3)}
NODE_ID = 1


class Answers:
    """Response frames by (api key, version), encoded at first use with correlation id 0."""

    def __init__(self, port: int, topic: str, partitions: int) -> None:
        self.port = port
        self.topic = topic
        self.partitions = partitions
        self.frames: dict[tuple[int, int], bytes] = {}

    def frame(self, key: int, version: int) -> bytes | None:
        found = self.frames.get((key, version))
        if found is None:
            body = self._body(key, version)
            if body is None:
                return None
            # Flexible versions (and every ApiVersions but its header) carry header tagged fields.
            flexible = {PRODUCE: 9, METADATA: 9}.get(key, 99) <= version
            found = self.frames[(key, version)] = frame_response(0, 1 if flexible else 0, body)
        return found

    def _body(self, key: int, v: int) -> bytes | None:
        lo, hi = VERSIONS.get(key, (0, -1))
        if not lo <= v <= hi:
            return None
        if key == API_VERSIONS:
            return bytes(ApiVersionsResponse(version=v, error_code=0, throttle_time_ms=0, api_keys=[
                ApiVersionsResponse.ApiVersion(api_key=k, min_version=a, max_version=b)
                for k, (a, b) in sorted(VERSIONS.items())]).encode(version=v))
        if key == METADATA:
            m = MetadataResponse
            partitions = [m.MetadataResponseTopic.MetadataResponsePartition(
                error_code=0, partition_index=i, leader_id=NODE_ID, leader_epoch=0, replica_nodes=[NODE_ID],
                isr_nodes=[NODE_ID], offline_replicas=[]) for i in range(self.partitions)]
            return bytes(m(version=v, throttle_time_ms=0, brokers=[m.MetadataResponseBroker(
                node_id=NODE_ID, host="127.0.0.1", port=self.port, rack=None)], cluster_id="sink",
                controller_id=NODE_ID, topics=[m.MetadataResponseTopic(
                    error_code=0, name=self.topic, topic_id=uuid.UUID(int=1), is_internal=False,
                    partitions=partitions)]).encode(version=v))
        p = ProduceResponse
        return bytes(p(version=v, throttle_time_ms=0, responses=[p.TopicProduceResponse(
            name=self.topic, partition_responses=[p.TopicProduceResponse.PartitionProduceResponse(
                index=0, error_code=0, base_offset=0, log_append_time_ms=-1, log_start_offset=0,
                record_errors=[], error_message=None)])]).encode(version=v))


class SinkConnection(asyncio.BufferedProtocol):
    """Splits request frames out of a buffer; answers each with its canned response."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.buffer = bytearray(1 << 20)
        self.view = memoryview(self.buffer)
        self.used = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self.buffer) - self.used < 65536:
            self.buffer.extend(bytes(len(self.buffer)))  # a frame larger than the buffer so far
            self.view = memoryview(self.buffer)
        return self.view[self.used:]

    def buffer_updated(self, nbytes: int) -> None:
        self.used += nbytes
        buf, pos, out = self.buffer, 0, []
        while self.used - pos >= 12:
            size = int.from_bytes(buf[pos:pos + 4], "big")
            if self.used - pos < 4 + size:
                break
            key = int.from_bytes(buf[pos + 4:pos + 6], "big")
            version = int.from_bytes(buf[pos + 6:pos + 8], "big")
            acks = None
            if key == PRODUCE:  # after the client id (and, from v3, the transactional id)
                at = pos + 12
                at += 2 + max(int.from_bytes(buf[at:at + 2], "big", signed=True), 0)
                if version >= 9:
                    at += 1  # the header's tagged fields
                if version >= 3:
                    if version >= 9:
                        at += max(buf[at] - 1, 0) + 1  # compact nullable string (short ones)
                    else:
                        at += 2 + max(int.from_bytes(buf[at:at + 2], "big", signed=True), 0)
                acks = int.from_bytes(buf[at:at + 2], "big", signed=True)
            frame = self.answers.frame(key, version)
            if frame is None:
                assert self.transport is not None
                self.transport.close()
                return
            if acks != 0:
                out.append(frame[:4] + buf[pos + 8:pos + 12] + frame[8:])
            pos += 4 + size
        if pos:
            self.buffer[:self.used - pos] = self.buffer[pos:self.used]
            self.used -= pos
        if out and self.transport is not None:
            self.transport.writelines(out)


async def serve(port: int, topic: str, partitions: int) -> None:
    loop = asyncio.get_running_loop()
    answers = Answers(port, topic, partitions)
    server = await loop.create_server(lambda: SinkConnection(answers), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sink_broker", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--topic", default="bench")
    p.add_argument("--partitions", type=int, default=1)
    args = p.parse_args(argv)
    asyncio_run(serve(args.port, args.topic, args.partitions))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
