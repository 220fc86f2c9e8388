#!/bin/sh
# server.properties from the KAFKA_* variables (KAFKA_LOG_DIRS -> log.dirs), the storage
# formatted on first start (KRaft), then the broker in the foreground.
set -eu
CONF=/opt/kafka/server.properties
env | grep '^KAFKA_' | while IFS='=' read -r name value; do
    key="$(echo "${name#KAFKA_}" | tr 'A-Z_' 'a-z.')"
    echo "$key=$value"
done > "$CONF"
LOGS="${KAFKA_LOG_DIRS:-/var/lib/kafka/data}"
mkdir -p "$LOGS"
CP="/opt/kafka/lib/*"
# A static quorum (KAFKA_CONTROLLER_QUORUM_VOTERS), so no --standalone.
java -cp "$CP" kafka.tools.StorageTool format -t "${CLUSTER_ID:-mdXH2RADQDGB_ge5FWRxLg}" \
    -c "$CONF" --ignore-formatted
exec java -Xmx512m -cp "$CP" kafka.Kafka "$CONF"
