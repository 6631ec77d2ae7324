#!/bin/sh
# sanitizer_reports.sh DIR - the reports sanitized processes wrote to DIR
# (their log_path: asan.<pid>, ubsan.<pid>, tsan.<pid>). Prints each, at
# most 120 lines of it, and exits 1 when there is one: a report from a
# process whose exit status nobody checks (a server stopped by the tests, a
# leak found as it exits) fails the run too. See docs/sanitizers.md.
dir=${1:?usage: sanitizer_reports.sh DIR}
n=0
for f in "$dir"/*; do
    [ -f "$f" ] || continue
    n=$((n + 1))
    echo "==== $f"
    head -n 120 "$f"
done
if [ "$n" -gt 0 ]; then
    echo "sanitizer_reports: $n report(s) in $dir" >&2
    exit 1
fi
echo "sanitizer_reports: no reports in $dir"
