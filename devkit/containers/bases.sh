#!/usr/bin/env bash
# Local stand-ins for the registry images that cannot be pulled here (no image registry is
# reachable from our machines), each built once and then reused:
#
#   localhost/kqp-base/debian:bookworm   debootstrap --variant=minbase of Debian 12, from the mirror
#                                        this machine's apt uses, plus this machine's extra CA
#                                        certificates (so pip and apt inside builds work here)
#   python:3.12-slim  (STAND-IN)         that base plus Debian's Python 3.11 and pip, linked into
#                                        /usr/local/bin as the official image has them. It is NOT
#                                        the official image: Debian 12 ships Python 3.11, which the
#                                        project supports (requires-python >= 3.11).
#
# The Dockerfile is built unchanged, `FROM python:3.12-slim` resolving to the stand-in.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BASE=localhost/kqp-base/debian:bookworm

have() { podman image exists "$1"; }

if ! have "$BASE"; then
  # The mirror this machine's apt already reaches (deb822 or one-line sources).
  mirror=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -n1)
  [[ -n $mirror ]] || mirror=$(awk '$1=="deb" && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
  [[ -n $mirror ]] || { echo "bases: no Debian mirror in this machine's apt sources" >&2; exit 1; }
  root=$(mktemp -d /var/tmp/kqp-rootfs.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  echo "bases: debootstrap bookworm (minbase) into $root"
  started=$SECONDS
  debootstrap --variant=minbase --include=ca-certificates bookworm "$root" "$mirror" >"$root.log" 2>&1 \
    || { tail -n 20 "$root.log" >&2; exit 1; }
  # This machine's own CAs (its network may re-sign TLS), so pip and apt in builds trust it too.
  if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >/dev/null 2>&1
  fi
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | podman import --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
  rm -f "$root.log"
  echo "bases: $BASE imported in $((SECONDS - started)) s"
fi

if ! have docker.io/library/python:3.12-slim; then
  echo "bases: building the STAND-IN for python:3.12-slim (Debian 12's Python 3.11 + pip)"
  podman build --pull=never -q -t docker.io/library/python:3.12-slim \
    --build-arg BASE="$BASE" -f "$here/python-standin.Containerfile" "$here" >/dev/null
fi
echo "bases: ready ($BASE; python:3.12-slim is a local stand-in)"
