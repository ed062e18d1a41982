"""kafka-quota-proxy: a Kafka-protocol proxy that enforces Kafka's client quotas in front of any
Kafka-compatible broker. The packages beneath: protocol (bytes and Kafka messages), quota (pure
quota logic), identity (principals, SASL, TLS names), config (files and flags into settings),
proxy (sockets, the event loop, the stage chains), analytics (the Spark usage pipeline), cli.
"""
