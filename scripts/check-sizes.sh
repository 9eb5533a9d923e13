#!/usr/bin/env bash
# Fails when a source file holds more than 800 lines or docs/benchmarks.md more than 400: a file a
# newcomer can hold in their head (docs/architecture.md). Prints every offender.
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
n=$(wc -l < docs/benchmarks.md)
if [ "$n" -gt 400 ]; then
  echo "too long: docs/benchmarks.md ($n lines, at most 400)"
  status=1
fi
exit $status
