#!/usr/bin/env bash
# apt-tools.sh COMMAND:PACKAGE… — install, with Debian's apt, each PACKAGE whose COMMAND is not on PATH.
# The test task uses it for the real tools its end-to-end tests drive (chromium, prometheus), as taskw
# does for libzmq: one line said per install, apt's output shown only when a step fails, nothing done
# (and nothing printed) when every command is present. As root it runs apt-get itself, else via sudo
# (non-interactive without a terminal).
set -euo pipefail

say() { printf 'apt-tools: %s\n' "$*" >&2; }
die() { printf 'apt-tools: error: %s\n' "$*" >&2; exit 1; }

pkgs=()
for pair in "$@"; do
  cmd=${pair%%:*} pkg=${pair#*:}
  command -v "$cmd" >/dev/null 2>&1 || pkgs+=("$pkg")
done
[ ${#pkgs[@]} -eq 0 ] && exit 0

say "installing ${pkgs[*]} with apt-get: the end-to-end tests drive them (the status page in a headless browser, the dashboard's queries in Prometheus)"
command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install ${pkgs[*]} by hand (Debian's packages)."
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || die "not root and no sudo; install ${pkgs[*]} as root (apt-get install ${pkgs[*]})."
  sudo=(sudo)
  [ -t 0 ] || sudo=(sudo -n)
fi
log=$(mktemp "${TMPDIR:-/tmp}/apt-tools.XXXXXX")
opts=(-q -o DPkg::Lock::Timeout=300)
if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" update </dev/null >"$log" 2>&1; then
  cat "$log" >&2
  die "apt-get update failed (output above; log $log)."
fi
if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" install -y --no-install-recommends "${pkgs[@]}" </dev/null >>"$log" 2>&1; then
  cat "$log" >&2
  die "apt-get install ${pkgs[*]} failed (output above; log $log)."
fi
rm -f "$log"
for pair in "$@"; do
  cmd=${pair%%:*}
  command -v "$cmd" >/dev/null 2>&1 || die "installed ${pkgs[*]}, but $cmd is still not on PATH."
done
say "installed ${pkgs[*]}"
