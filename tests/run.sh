#!/usr/bin/env bash
# The whole suite as four pytest sessions at once, one per stream (tests/streams.py):
# the tests on the one-node local cluster, those on the two-node one, those on clusters
# of their own, and the rest. Most of the SLURM tests' time is waiting (scheduler polls,
# job start-up), so on a 2-core machine the four together take about half as long as
# one after the other. The rest prints as it runs; the others print when all have
# finished (their logs are kept in the folder named at the start). Arguments go to every
# session.
# Exit status: 0 when every stream passed (a stream with no test selected counts as passed).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
LOGS="$(mktemp -d "${TMPDIR:-/tmp}/hvdscale-tests.XXXXXX")"
BESIDE=(cluster two-node apart)
echo "tests: streams ${BESIDE[*]} run beside this one; their logs: $LOGS"
start=$(date +%s)
declare -A pid
for stream in "${BESIDE[@]}"; do
    (
        HVDSCALE_TEST_STREAM=$stream "$PYTHON" -m pytest -p no:cacheprovider --durations=10 "$@" \
            > "$LOGS/$stream.log" 2>&1
        echo "$? $(($(date +%s) - start))" > "$LOGS/$stream.end"
    ) &
    pid[$stream]=$!
done
stop() { pkill -P "$(IFS=,; echo "${pid[*]}")" 2>/dev/null; }
trap 'stop; exit 130' INT TERM
HVDSCALE_TEST_STREAM=rest "$PYTHON" -m pytest --durations=10 "$@"
declare -A rc=([rest]=$?)
declare -A took=([rest]=$(($(date +%s) - start)))
for stream in "${BESIDE[@]}"; do
    wait "${pid[$stream]}"
    read -r rc[$stream] took[$stream] < "$LOGS/$stream.end" || rc[$stream]=1
    echo
    echo "=================================== stream $stream ==================================="
    cat "$LOGS/$stream.log"
done
echo
status=0
for stream in rest "${BESIDE[@]}"; do
    [[ ${rc[$stream]} == 5 ]] && rc[$stream]=0  # no test of this stream selected
    verdict=passed
    [[ ${rc[$stream]} != 0 ]] && verdict="FAILED (pytest exit ${rc[$stream]})" && status=1
    echo "tests: stream $stream $verdict, done after ${took[$stream]} s"
done
echo "tests: $(( $(date +%s) - start )) s in all"
exit $status
