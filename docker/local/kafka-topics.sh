#!/bin/sh
# The official image's /opt/kafka/bin/kafka-topics.sh, from the same jars.
exec java -Xmx256m -XX:TieredStopAtLevel=1 -cp '/opt/kafka/lib/*' org.apache.kafka.tools.TopicCommand "$@"
