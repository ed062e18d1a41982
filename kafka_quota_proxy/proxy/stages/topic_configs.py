"""Topic quotas through `kafka-configs.sh --entity-type topics` (quota/topic_configs.py; the
choices: docs/topic-quotas.md).

IncrementalAlterConfigs: the ops on `producer_byte_rate` and `consumer_byte_rate` of a TOPIC
resource are the proxy's. They pass the same access check as AlterClientQuotas and are applied
through the same path (state file, shared store, audit). A resource of quota ops alone is answered
by the proxy; a resource with other configs too goes to the broker without its quota ops, which
are applied once the broker has accepted the rest, so the resource stays all or nothing. A refused
resource (not allowed, or a bad op) never reaches the broker. The response carries every
resource in the request's order. A request with no quota key is forwarded untouched.

DescribeConfigs: a topic described without error gains the quota keys set on it, as its own
(DYNAMIC_TOPIC_CONFIG) configs, when the principal may describe quotas.
"""

from __future__ import annotations

import struct
from typing import Any

from kafka.protocol.admin.configs import (
    DescribeConfigsResponse,
    IncrementalAlterConfigsResponse,
)

from kafka_quota_proxy.protocol.api_keys import DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS
from kafka_quota_proxy.protocol.error_codes import CLUSTER_AUTHORIZATION_FAILED, INVALID_REQUEST
from kafka_quota_proxy.protocol.messages import encode_element
from kafka_quota_proxy.protocol.pieces import Edit, Pieces, spliced
from kafka_quota_proxy.protocol.primitives import encode_length
from kafka_quota_proxy.protocol.walk import request_walker, response_walker
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.quota_runtime.access import QuotaAccess
from kafka_quota_proxy.proxy.quota_runtime.control import QuotaControl
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage, ResponseStage
from kafka_quota_proxy.proxy.stages.client_quotas_api import not_null
from kafka_quota_proxy.quota.admin_api import QuotaRequestError, WireEntity, WireOp
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity
from kafka_quota_proxy.quota.kinds import topic_keys
from kafka_quota_proxy.quota.topic_configs import (
    DELETE,
    DOCUMENTATION,
    DUPLICATE_RESOURCE,
    DYNAMIC_TOPIC_CONFIG,
    LONG,
    MARKER,
    QUOTA_CONFIGS,
    TOPIC_RESOURCE,
    AlterPlan,
    DescribeAdditions,
    WireConfig,
    describe_entries,
    has_quota_configs,
    merge_answers,
    resource_conflicts,
    split_resource,
    topic_entity,
)

_SIZE = struct.Struct(">i")
RESULTS = "Responses"  # IncrementalAlterConfigs' results


def _audit_ops(configs: list[WireConfig]) -> list[WireOp]:
    """A refused resource's quota ops for the audit line, as far as they read."""
    ops: list[WireOp] = []
    for name, op, value in configs:
        if name in QUOTA_CONFIGS:
            try:
                number = float(value) if value is not None else float("nan")
            except ValueError:
                number = float("nan")
            ops.append((name, number, op == DELETE))
    return ops


class TopicConfigsAlter(RequestStage):
    """Takes a TOPIC resource's quota ops out of IncrementalAlterConfigs and answers or applies
    them at the proxy."""

    api_keys = frozenset({INCREMENTAL_ALTER_CONFIGS})

    def __init__(self, control: QuotaControl, engine: QuotaEngine, access: QuotaAccess) -> None:
        self.control = control
        self.engine = engine  # its settings change on reload
        self.access = access

    def on_request(self, ctx: RequestContext) -> Reply | None:
        if bytes(ctx.frame).find(MARKER) < 0:
            return None  # no quota key in it: forwarded as it is, never decoded
        request = ctx.decode_request()
        wire = not_null(request.resources, "resources")
        resources = [(r.resource_type, r.resource_name) for r in wire]
        configs = [[(c.name, c.config_operation, c.value) for c in not_null(r.configs, "configs")]
                   for r in wire]
        ours = [i for i, (kind, _) in enumerate(resources)
                if kind == TOPIC_RESOURCE and has_quota_configs(configs[i])]
        if not ours:
            return None
        plan = self._judge(ctx, resources, configs, ours, request.validate_only)
        forwarded = [i for i, answer in enumerate(plan.answers) if answer is None]
        if not forwarded:
            return Reply(_alter_response(ctx.api_version, 0, merge_answers(plan, [])))
        body = trimmed_request(ctx.frame[ctx.header.body_offset:], ctx.api_version, wire, forwarded,
                               set(plan.after_broker))
        head = bytes(ctx.frame[4:ctx.header.body_offset])  # the client's header, as it came
        ctx.replace(Pieces((_SIZE.pack(len(head) + len(body)), head, body)))
        ctx.topic_work().configs = plan
        return None

    def _judge(self, ctx: RequestContext, resources: list[tuple[int, str]], configs: list[list[WireConfig]],
               ours: list[int], validate_only: bool) -> AlterPlan:
        """Answer, or keep for after the broker, each resource with quota ops: refused (a
        duplicate, not allowed, a bad op), applied now (quota ops alone), or waiting for the
        broker to accept the rest of it. Audited as AlterClientQuotas is."""
        plan = AlterPlan(resources, [None] * len(resources), validate_only=validate_only)
        conn = ctx.conn
        verdict = self.access.may_alter(self.engine.settings, conn.principal, conn.ip)
        # A resource twice is refused by a broker, each time; the proxy refuses them all when one
        # is its own, so that the broker cannot accept the other copy alone.
        doubled = {resources[i] for i in resource_conflicts(resources) & set(ours)}
        for i, resource in enumerate(resources):
            if resource in doubled:
                plan.answers[i] = (INVALID_REQUEST, DUPLICATE_RESOURCE)
        refused: list[tuple[WireEntity, list[WireOp]]] = []
        refusals: list[tuple[int, str | None]] = []
        at_once: list[tuple[int, list[WireOp]]] = []
        for i in ours:
            name = resources[i][1]
            answer = plan.answers[i]
            if answer is None and not verdict.allowed:
                self.access.note_refusal(self.engine.settings)
                answer = (CLUSTER_AUTHORIZATION_FAILED, verdict.reason)
            if answer is None:
                try:
                    alteration = split_resource(name, configs[i])
                except QuotaRequestError as e:
                    answer = (e.error_code, e.message)
                else:
                    if alteration.broker_ops:
                        plan.after_broker[i] = alteration.ops
                    else:
                        at_once.append((i, alteration.ops))
                    continue
            plan.answers[i] = answer
            refused.append((topic_entity(name), _audit_ops(configs[i])))
            refusals.append(answer)
        before = self.control.effective()
        audit = self.control.audit
        if refused:
            audit.api_alter(conn.principal, conn.peer, before, refused, refusals, validate_only)
        if at_once:
            entries = [(topic_entity(resources[i][1]), ops) for i, ops in at_once]
            results = self.control.alter(entries, validate_only).results
            audit.api_alter(conn.principal, conn.peer, before, entries, results, validate_only)
            for (i, _), result in zip(at_once, results, strict=True):
                plan.answers[i] = result
        return plan


def _alter_response(version: int, throttle_ms: int, results: list[tuple[int, str, int, str | None]]) -> bytes:
    cls: Any = IncrementalAlterConfigsResponse
    return bytes(cls(version=version, throttle_time_ms=throttle_ms, responses=[
        cls.AlterConfigsResourceResponse(error_code=code, error_message=message, resource_type=kind,
                                         resource_name=name)
        for kind, name, code, message in results]).encode(version=version))


class TopicConfigsDescribe(RequestStage):
    """Notes which topics of a DescribeConfigs have quota keys to add to the broker's answer."""

    api_keys = frozenset({DESCRIBE_CONFIGS})

    def __init__(self, control: QuotaControl, engine: QuotaEngine, access: QuotaAccess) -> None:
        self.control = control
        self.engine = engine
        self.access = access

    def on_request(self, ctx: RequestContext) -> Reply | None:
        store = self.control.store
        if not any(store.topic_quotas_enabled(key) for key in topic_keys()):
            return None  # no topic quota was ever set: nothing to add, nothing decoded
        conn = ctx.conn
        if not self.access.may_describe(self.engine.settings, conn.principal, conn.ip).allowed:
            return None  # the topic's own configs are the broker's to show; its quotas are not
        request = ctx.decode_request()
        entries = {}
        for resource in not_null(request.resources, "resources"):
            name = resource.resource_name
            if resource.resource_type != TOPIC_RESOURCE or not name or name == DEFAULT:
                continue
            found = describe_entries(store.get(QuotaEntity(topic=name)), resource.configuration_keys)
            if found:
                entries[name] = found
        if entries:
            ctx.topic_work().configs = DescribeAdditions(
                entries, synonyms=ctx.api_version >= 1 and request.include_synonyms,
                documentation=ctx.api_version >= 3 and request.include_documentation)
        return None


class TopicConfigsAnswer(ResponseStage):
    """Merges the proxy's part into the broker's answer: the results of the resources the proxy
    answered (applying the quota ops that waited for the broker), or a topic's quota entries."""

    api_keys = frozenset({INCREMENTAL_ALTER_CONFIGS, DESCRIBE_CONFIGS})

    def __init__(self, control: QuotaControl) -> None:
        self.control = control

    def wants(self, ctx: RequestContext) -> bool:
        return ctx.topics is not None and ctx.topics.configs is not None

    def on_response(self, ctx: RequestContext, body: memoryview) -> bytes | Pieces | None:
        plan = ctx.topics.configs if ctx.topics is not None else None
        msg = ctx.decode_response(body)
        if isinstance(plan, DescribeAdditions):
            return described(body, ctx.api_version, msg, plan)
        assert isinstance(plan, AlterPlan)
        broker = broker_results(msg)
        merged = merge_answers(plan, broker)
        self._after_broker(ctx, plan, merged)
        return merged_response(body, ctx.api_version, broker, merged)

    def _after_broker(self, ctx: RequestContext, plan: AlterPlan,
                      merged: list[tuple[int, str, int, str | None]]) -> None:
        """Apply the quota ops of each mixed resource the broker accepted; the others' are
        refused (audited so) and change nothing."""
        conn, audit = ctx.conn, self.control.audit
        by_resource = {(kind, name): at for at, (kind, name, _, _) in enumerate(merged)}
        for index, ops in plan.after_broker.items():
            resource = plan.resources[index]
            entry = [(topic_entity(resource[1]), ops)]
            before = self.control.effective()
            at = by_resource.get(resource)
            results: list[tuple[int, str | None]]
            if at is None:  # the broker left it out of its answer: nothing is known to have changed
                results = [(INVALID_REQUEST, "the broker did not answer for it")]
            elif merged[at][2]:
                results = [(merged[at][2], f"the broker refused the topic's other configs: {merged[at][3]}")]
            else:
                results = self.control.alter(entry, plan.validate_only).results
                if results[0][0]:
                    merged[at] = (*resource, *results[0])
            audit.api_alter(conn.principal, conn.peer, before, entry, results, plan.validate_only)


def trimmed_request(body: memoryview, version: int, wire: list[Any], forwarded: list[int],
                    trimmed: set[int]) -> bytes:
    """The client's request with only the `forwarded` resources, the `trimmed` ones without their
    quota configs. Every byte kept is the client's: the other resources' and configs' bytes,
    tagged fields a newer client adds included, are spliced, not encoded again."""
    top = request_walker(INCREMENTAL_ALTER_CONFIGS, version)
    at = top.walk(body, 0)
    layout = top.items("Resources")
    elements = top.elements(body, at, "Resources")
    items: list[bytes | memoryview] = []
    for i in forwarded:
        element = elements[i]
        if i not in trimmed:
            items.append(body[element.start : element.end])
            continue
        raw = layout.elements(body, element, "Configs")
        configs = [body[config.start : config.end]
                   for c, config in zip(wire[i].configs, raw, strict=True) if c.name not in QUOTA_CONFIGS]
        start, end = element.span("Configs")
        kept = encode_length(len(configs), layout.compact("Configs")) + b"".join(configs)
        items.append(bytes(body[element.start : start]) + kept + bytes(body[end : element.end]))
    start, end = at.span("Resources")
    array = encode_length(len(items), top.compact("Resources")) + b"".join(items)
    return spliced(body, [(start, end, array)]).join()


def broker_results(msg: Any) -> list[tuple[int, str, int, str | None]]:
    """A decoded IncrementalAlterConfigs response's results, (resource type, name, error code,
    message); its array is never null (Kafka's parser refuses one, and so does the proxy: the
    broker's answer is then a protocol error, not a crash of the stage)."""
    return [(r.resource_type, r.resource_name, r.error_code, r.error_message)
            for r in not_null(msg.responses, "IncrementalAlterConfigs responses")]


def merged_response(body: memoryview, version: int, broker: list[tuple[int, str, int, str | None]],
                     merged: list[tuple[int, str, int, str | None]]) -> bytes:
    """The broker's response with the merged results in place of its own. A broker result that
    merge_answers passed on as it was (the very tuple) keeps the broker's bytes, tagged fields and
    all; the proxy's are written new. Every other byte is the broker's."""
    top = response_walker(INCREMENTAL_ALTER_CONFIGS, version)
    at = top.walk(body, 0)
    raw = {id(result): body[element.start : element.end]
           for result, element in zip(broker, top.elements(body, at, RESULTS), strict=True)}
    cls: Any = IncrementalAlterConfigsResponse.AlterConfigsResourceResponse
    items: list[bytes | memoryview] = []
    for result in merged:
        kept = raw.get(id(result))
        if kept is not None:
            items.append(kept)
            continue
        kind, name, code, message = result
        items.append(encode_element(cls(error_code=code, error_message=message, resource_type=kind,
                                        resource_name=name), version, top.flexible))
    start, end = at.span(RESULTS)
    array = encode_length(len(items), top.compact(RESULTS)) + b"".join(items)
    return spliced(body, [(start, end, array)]).join()


def described(body: memoryview, version: int, msg: Any, plan: DescribeAdditions) -> bytes | None:
    """The broker's response with each described topic's quota entries in place of any it had of
    those names: only those topics' config arrays change, the broker's entries kept as its bytes."""
    result_cls: Any = DescribeConfigsResponse.DescribeConfigsResult
    entry = result_cls.DescribeConfigsResourceResult
    top = response_walker(DESCRIBE_CONFIGS, version)
    at = top.walk(body, 0)
    layout = top.items("Results")
    edits: list[Edit] = []
    results = not_null(msg.results, "DescribeConfigs results")  # never null (broker_results)
    for result, element in zip(results, top.elements(body, at, "Results"), strict=True):
        found = plan.entries.get(result.resource_name)
        if result.resource_type != TOPIC_RESOURCE or result.error_code or found is None:
            continue
        names = {name for name, _ in found}
        configs: list[bytes | memoryview] = [
            body[config.start : config.end]
            for c, config in zip(result.configs or [], layout.elements(body, element, "Configs"), strict=True)
            if c.name not in names]
        for name, value in found:
            synonyms = [entry.DescribeConfigsSynonym(name=name, value=value, source=DYNAMIC_TOPIC_CONFIG)]
            configs.append(encode_element(entry(
                name=name, value=value, read_only=False, is_default=False, is_sensitive=False,
                config_source=DYNAMIC_TOPIC_CONFIG, synonyms=synonyms if plan.synonyms else [],
                config_type=LONG, documentation=DOCUMENTATION[name] if plan.documentation else None),
                version, top.flexible))
        start, end = element.span("Configs")
        edits.append((start, end, encode_length(len(configs), layout.compact("Configs")) + b"".join(configs)))
    return spliced(body, edits).join() if edits else None
