#!/bin/sh
# run.sh - `make fuzz`: runs each libFuzzer target for a bounded time, one
# at a time, and ends with one summary line per target.
#
#   tests/fuzz/run.sh BIN_DIR OUT_DIR SECONDS TARGET...
#
# Each target reads its seeds from tests/fuzz/corpus/<target>/ and keeps what
# it finds in OUT_DIR/corpus/<target>/ (the repository's seeds are never
# written); a crash leaves OUT_DIR/crash-<sha1> (or timeout-, oom-, leak-),
# and its log is OUT_DIR/log/<target>.log. The exit status is non-zero when
# any target crashed or failed to run.
set -u
bin=$1 out=$2 secs=$3
shift 3
mkdir -p "$out/log"
summary=""
status=0
for t in "$@"; do
    mkdir -p "$out/corpus/$t"
    dict=tests/fuzz/${t#fuzz_}.dict
    [ -f "$dict" ] && dict="-dict=$dict" || dict=""
    log="$out/log/$t.log"
    echo "== $t for $secs s (log: $log)"
    before=$(ls "$out" | grep -c -E '^(crash|timeout|oom|leak)-' || true)
    UBSAN_OPTIONS=halt_on_error=1 "$bin/$t" -max_total_time="$secs" -timeout=25 -print_final_stats=1 \
        -artifact_prefix="$out/" $dict "$out/corpus/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1
    rc=$?
    after=$(ls "$out" | grep -c -E '^(crash|timeout|oom|leak)-' || true)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    new=$(sed -n 's/^stat::new_units_added: *//p' "$log" | tail -1)
    corpus=$(ls "$out/corpus/$t" | wc -l)
    crashes=$((after - before))
    if [ "$rc" != 0 ] && [ "$crashes" = 0 ]; then crashes="failed (rc $rc)"; fi
    [ "$rc" != 0 ] && { status=1; tail -40 "$log"; }
    line=$(printf '%-24s %8s execs %8s exec/s %6s new %6s corpus   crashes: %s' "$t" "${execs:-?}" \
        "${rate:-?}" "${new:-?}" "$corpus" "$crashes")
    summary="$summary$line
"
done
echo "== fuzz summary ($secs s a target)"
printf '%s' "$summary"
ls "$out" | grep -E '^(crash|timeout|oom|leak)-' | sed "s|^|   artifact: $out/|"
exit $status
