#!/bin/sh
# The official image's /opt/kafka/bin/kafka-console-consumer.sh, from the same jars.
exec java -Xmx256m -XX:TieredStopAtLevel=1 -cp '/opt/kafka/lib/*' \
    org.apache.kafka.tools.consumer.ConsoleConsumer "$@"
