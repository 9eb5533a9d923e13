#!/usr/bin/env bash
# Fails when a source file holds more than 800 lines, docs/benchmarks.md more than 400 or
# docs/generalization.md more than 1,100: a file a newcomer can hold in their head
# (docs/architecture.md). Prints every offender.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
while IFS= read -r f; do
  n=$(wc -l < "$f")
  if [ "$n" -gt 800 ]; then
    echo "too long: $f ($n lines, at most 800)"
    status=1
  fi
done < <(git ls-files '*.rs' '*.py' '*.sh' '*.go')
# The two measurement references: the latest run of each command, not a diary of every run.
for limit in docs/benchmarks.md:400 docs/generalization.md:1100; do
  f=${limit%%:*}
  max=${limit##*:}
  n=$(wc -l < "$f")
  if [ "$n" -gt "$max" ]; then
    echo "too long: $f ($n lines, at most $max)"
    status=1
  fi
done
exit $status
