"""Kafka's API keys, by Kafka's names (clients/src/main/resources/common/message/*Request.json):
the one place the proxy spells them."""

from __future__ import annotations

PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
SASL_HANDSHAKE = 17
API_VERSIONS = 18
CREATE_TOPICS = 19
DELETE_TOPICS = 20
DELETE_RECORDS = 21
INIT_PRODUCER_ID = 22
OFFSET_FOR_LEADER_EPOCH = 23
ADD_PARTITIONS_TO_TXN = 24
ADD_OFFSETS_TO_TXN = 25
END_TXN = 26
TXN_OFFSET_COMMIT = 28
DESCRIBE_ACLS = 29
CREATE_ACLS = 30
DELETE_ACLS = 31
DESCRIBE_CONFIGS = 32
ALTER_CONFIGS = 33
ALTER_REPLICA_LOG_DIRS = 34
DESCRIBE_LOG_DIRS = 35
SASL_AUTHENTICATE = 36
CREATE_PARTITIONS = 37
CREATE_DELEGATION_TOKEN = 38
RENEW_DELEGATION_TOKEN = 39
EXPIRE_DELEGATION_TOKEN = 40
DESCRIBE_DELEGATION_TOKEN = 41
DELETE_GROUPS = 42
ELECT_LEADERS = 43
INCREMENTAL_ALTER_CONFIGS = 44
ALTER_PARTITION_REASSIGNMENTS = 45
LIST_PARTITION_REASSIGNMENTS = 46
OFFSET_DELETE = 47
DESCRIBE_CLIENT_QUOTAS = 48
ALTER_CLIENT_QUOTAS = 49
DESCRIBE_USER_SCRAM_CREDENTIALS = 50
ALTER_USER_SCRAM_CREDENTIALS = 51
DESCRIBE_QUORUM = 55
UPDATE_FEATURES = 57
DESCRIBE_CLUSTER = 60
CONSUMER_GROUP_HEARTBEAT = 68
CONSUMER_GROUP_DESCRIBE = 69
SHARE_GROUP_HEARTBEAT = 76
SHARE_GROUP_DESCRIBE = 77
SHARE_FETCH = 78
SHARE_ACKNOWLEDGE = 79
STREAMS_GROUP_HEARTBEAT = 88
STREAMS_GROUP_DESCRIBE = 89

# The client APIs the proxy refuses on purpose, with why: left out of its ApiVersions answer, and
# a request that names one anyway closes its connection, as a broker does for a key it lacks. A
# client sees a broker without them (docs/deployment.md, "In front of Apache Kafka"). None today:
# KIP-932's share groups, the last ones here, are charged and rewritten as Kafka does
# (docs/quotas.md, "Share groups").
REFUSED: dict[int, str] = {}

# The fetches charged to the consumer byte-rate quota: Fetch, and KIP-932's ShareFetch
# (KafkaApis.processShareFetchResponse records it in quotas.fetch as handleFetchRequest does).
FETCHES = frozenset({FETCH, SHARE_FETCH})

# The controller mutations KIP-599 counts (partitions created or deleted).
CONTROLLER_MUTATIONS = frozenset({CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS})
