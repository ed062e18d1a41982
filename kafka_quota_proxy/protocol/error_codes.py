"""Kafka's error codes that the proxy itself answers with (Kafka's Errors.java): the one place
the proxy spells them."""

from __future__ import annotations

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3  # read in Metadata responses: the topic is gone
NOT_ENOUGH_REPLICAS = 19
CLUSTER_AUTHORIZATION_FAILED = 31
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
UNSUPPORTED_VERSION = 35
INVALID_CONFIG = 40
INVALID_REQUEST = 42
POLICY_VIOLATION = 44
SASL_AUTHENTICATION_FAILED = 58
THROTTLING_QUOTA_EXCEEDED = 89
INVALID_SHARE_SESSION_EPOCH = 123  # kept in a throttled ShareFetch response, as Kafka keeps it
