"""Apache Kafka's message specs (Apache License 2.0, as each file's header says) for the client APIs
that kafka-python's codec lacks, copied unchanged from the kafka-clients jar named in SOURCE by
`python -m devkit.kafka_specs`; protocol/apis.py builds the codec for those APIs from them."""
