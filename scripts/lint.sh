#!/usr/bin/env bash
# lint.sh — fail if any Go file is not gofmt-formatted, then run go vet.
# Skips bin/, .git/, .fpmbus/ (demo data), vendor/ and testdata/ (fixtures may be malformed on purpose).
set -euo pipefail
cd "$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")/.."

unformatted=$(find . \( -name .git -o -name bin -o -name .fpmbus -o -name vendor -o -name testdata \) -prune \
  -o -type f -name '*.go' -print0 | xargs -0 -r gofmt -l)
if [ -n "$unformatted" ]; then
  echo "lint: these files need gofmt (run: gofmt -w <file>):"
  printf '  %s\n' $unformatted
  exit 1
fi
echo "lint: gofmt ok"
go vet ./...
echo "lint: go vet ok"
