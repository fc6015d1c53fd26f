#!/usr/bin/env bash
# fuzz.sh [FUZZTIME] — run every Go fuzz target in the module, one after another, for FUZZTIME each
# (default 30s). `go test -fuzz` takes one package and one target at a time, so the targets are listed
# with `go test -list '^Fuzz' ./...` and run as (package, target) pairs. A failure's input is kept by
# go test under <package>/testdata/fuzz/<Target>/; the script goes on with the other targets and exits
# non-zero at the end if any failed.
set -euo pipefail
cd "$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")/.."

fuzztime=${1:-${FUZZTIME:-30s}}

# `go test -list` prints a package's matching names, then "ok <import path> <time>" for that package.
if ! listing=$(go test -run='^$' -list '^Fuzz' ./... 2>&1); then
  printf '%s\n' "$listing"
  echo "fuzz: listing the Fuzz targets failed (above)"
  exit 1
fi
pairs=$(awk '
  /^Fuzz[A-Za-z0-9_]*$/ { names[++n] = $1; next }
  /^ok[ \t]/            { for (i = 1; i <= n; i++) print $2, names[i]; n = 0 }
' <<<"$listing")

if [ -z "$pairs" ]; then
  echo "fuzz: no Fuzz targets in the module"
  exit 0
fi

total=$(wc -l <<<"$pairs")
echo "fuzz: $total target(s), $fuzztime each"
failed=()
while read -r pkg name; do
  echo "=== fuzz $pkg $name"
  if ! go test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" "$pkg" </dev/null; then
    failed+=("$pkg $name")
  fi
done <<<"$pairs"

if [ ${#failed[@]} -gt 0 ]; then
  printf 'fuzz: FAIL %s\n' "${failed[@]}"
  exit 1
fi
echo "fuzz: all $total target(s) ran $fuzztime without a failure"
