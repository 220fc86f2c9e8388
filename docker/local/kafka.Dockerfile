# Apache Kafka (KRaft) from the jars scripts/kafka.sh fetches from Maven Central, on a Java
# runtime from Debian's packages (the tests' stand-in for the official image; it reads the
# same KAFKA_* variables: KAFKA_NODE_ID -> node.id, and so on).
ARG BASE_IMAGE=jobs-engine-jre:trixie
FROM ${BASE_IMAGE}
COPY lib /opt/kafka/lib
COPY kafka-entrypoint.sh /usr/local/bin/
COPY kafka-topics.sh kafka-console-consumer.sh /opt/kafka/bin/
EXPOSE 9092 9093
ENTRYPOINT ["/usr/local/bin/kafka-entrypoint.sh"]
