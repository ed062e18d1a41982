#!/bin/sh
# The distribution's bin/kafka-broker-api-versions.sh, which docker-compose.yml's health check
# calls: the same tool (BrokerApiVersionsCommand) on the stand-in's jars, with a small heap.
exec java -Xmx64m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -cp '/opt/kafka/libs/*' \
  org.apache.kafka.tools.BrokerApiVersionsCommand "$@"
