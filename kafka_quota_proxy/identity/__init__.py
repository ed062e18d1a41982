"""Who is calling: SASL tokens, credentials, Kafka's principal mapping rules. Pure logic, no I/O
beyond reading and atomically writing the credentials file."""

# Kafka's principal for a connection that did not authenticate.
ANONYMOUS = "ANONYMOUS"
