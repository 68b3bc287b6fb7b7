#!/usr/bin/env bash
# The README's Quick start on a clean Debian 12, as a newcomer meets it: a minimal Debian 12
# (debootstrap --variant=minbase) in a chroot, git and make added, this repository cloned, then
#   1. `make train` on the clone: what it installs (packages, MB) and how long it takes;
#   2. `make test` on a second, fresh clone with an empty ccache: what it adds and how long.
# The figures go to $OUT/summary.md (README, "Quick start"). Needs root, debootstrap and the
# network (Debian's mirror; npm's registry for the tokenizer fixtures). Takes about an hour on
# 2 cores.
#   sudo scripts/clean-debian-check.sh [ROOT]     # ROOT default /srv/forge-debian12 (reused if present)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${1:-/srv/forge-debian12}
OUT=${OUT:-$REPO/clean-debian-check}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
mkdir -p "$OUT"
[ "$(id -u)" = 0 ] || { echo "clean-debian-check: needs root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "clean-debian-check: apt-get install debootstrap" >&2; exit 1; }

if [ ! -x "$ROOT/bin/bash" ]; then
  debootstrap --variant=minbase bookworm "$ROOT" "$MIRROR" >"$OUT/debootstrap.log" 2>&1
fi
cleanup() {
  for m in src dev/pts dev sys proc; do umount -l "$ROOT/$m" 2>/dev/null || true; done
}
trap cleanup EXIT
mount -t proc proc "$ROOT/proc"
mount --rbind /sys "$ROOT/sys"
mount --rbind /dev "$ROOT/dev"
mkdir -p "$ROOT/src"
mount --bind "$REPO" "$ROOT/src"
mount -o remount,bind,ro "$ROOT/src"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# An installed Debian has /etc/hosts naming its host; debootstrap writes none, and without it every
# mpirun of the tests waits for name lookups to time out (tens of seconds each).
[ -f "$ROOT/etc/hosts" ] || cp /etc/hosts "$ROOT/etc/hosts"

# This host's network may inspect TLS with a CA of its own (installed in its system store, and
# NODE_EXTRA_CA_CERTS for npm): the chroot gets the same trust, and nothing else of the host.
EXTRA_ENV=()
[ -n "${NODE_EXTRA_CA_CERTS:-}" ] && EXTRA_ENV+=(NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt)
in_root() { chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
  LANG=C.UTF-8 TERM=dumb "${EXTRA_ENV[@]}" bash -c "$1"; }
packages() { in_root "dpkg-query -W -f='\${Status}\n' | grep -c 'install ok installed'"; }
used_mb() { in_root "du -smx --exclude=/src / 2>/dev/null | cut -f1"; }

in_root "apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends git make ca-certificates >/dev/null"
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$ROOT/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/"
  in_root "update-ca-certificates >/dev/null 2>&1"
fi
in_root "git config --global --add safe.directory '*'"

# 1. make train on a fresh clone (SKIP_TRAIN=1: its figures from an earlier run's $OUT/train.env).
if [ "${SKIP_TRAIN:-0}" = 1 ] && [ -f "$OUT/train.env" ]; then
  # shellcheck disable=SC1091
  . "$OUT/train.env"
else
  p0=$(packages); m0=$(used_mb)
  in_root "rm -rf /root/forge && git clone -q /src /root/forge"
  t0=$(date +%s)
  in_root "cd /root/forge && make train" >"$OUT/make-train.log" 2>&1
  t1=$(date +%s)
  p1=$(packages); m1=$(used_mb)
  # (the clone and its build counted apart from the packages)
  b1=$(in_root "du -smx /root/forge /root/.ccache /root/.cache 2>/dev/null | awk '{s+=\$1} END {print s}'")
  echo "p0=$p0 m0=$m0 t0=$t0 t1=$t1 p1=$p1 m1=$m1 b1=$b1" >"$OUT/train.env"
fi

# 2. make test on a second fresh clone, the compiler cache emptied.
in_root "rm -rf /root/forge-test && git clone -q /src /root/forge-test && (ccache -C >/dev/null 2>&1 || true)"
t2=$(date +%s)
in_root "cd /root/forge-test && make test" >"$OUT/make-test.log" 2>&1
t3=$(date +%s)
p2=$(packages); m2=$(used_mb)
b2=$(in_root "du -smx /root/forge /root/forge-test /root/.ccache /root/.cache 2>/dev/null | awk '{s+=\$1} END {print s}'")

mins() { awk -v s="$1" 'BEGIN { printf "%d:%02d", s / 60, s % 60 }'; }
{
  echo "# make train and make test on a clean Debian 12 ($(date -u +%Y-%m-%d), $(nproc) cores, commit $(git -C "$REPO" rev-parse --short HEAD))"
  echo
  echo "| step | packages installed | disk added (MB, packages) | time |"
  echo "|---|---|---|---|"
  echo "| base: debootstrap minbase + git, make, ca-certificates | $p0 | $m0 (whole system) | |"
  echo "| \`make train\` (fresh clone) | +$((p1 - p0)) | +$((m1 - m0 - b1)) | $(mins $((t1 - t0))) |"
  echo "| \`make test\` (second fresh clone, empty ccache) | +$((p2 - p1)) | +$((m2 - m1 - b2 + b1)) | $(mins $((t3 - t2))) |"
  echo
  echo "apt's own figures:"
  grep -h -E "newly installed|After this operation" "$OUT/make-train.log" "$OUT/make-test.log" | sed 's/^/    /'
  echo
  echo "make train ends with:"
  grep -E "val loss|done:" "$OUT/make-train.log" | tail -2 | sed 's/^/    /'
  echo "make test ends with:"
  grep -E "tests passed|tests failed" "$OUT/make-test.log" | sed 's/^/    /'
} >"$OUT/summary.md"
cat "$OUT/summary.md"
