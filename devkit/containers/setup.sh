#!/usr/bin/env bash
# Podman on a machine like ours, as `make containers` and `make compose-demo` need it: Debian's
# podman, runc and buildah (installed if missing; root), the runtime settings this sandbox needs
# (written only where they are not there yet), and the local base images that stand in for the
# registry images, which cannot be pulled here (devkit/containers/bases.sh).
#
# Idempotent: a second run changes nothing and takes a second.
set -euo pipefail

need=()
for tool in podman:podman runc:runc buildah:buildah debootstrap:debootstrap docker-compose:docker-compose; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool#*:}")
done
if ((${#need[@]})); then
  if [[ $(id -u) != 0 ]]; then
    echo "setup: missing ${need[*]}, and installing them needs root (apt-get)" >&2
    exit 1
  fi
  echo "setup: installing ${need[*]} from Debian"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The sandbox forbids raising rlimits, so podman's default ulimits (nofile 1048576) make every
# container fail to start: ask for the hard limit we have. Its cgroups are v1 with no systemd, so
# runc rather than crun.
conf=/etc/containers/containers.conf
hard=$(ulimit -Hn)
if ! grep -qs 'kafka-quota-proxy' "$conf"; then
  if [[ -s $conf ]]; then
    echo "setup: $conf exists and is not ours; leaving it as it is" >&2
  else
    mkdir -p /etc/containers
    cat >"$conf" <<CONF
# Written by kafka-quota-proxy's devkit/containers/setup.sh for this sandbox: it forbids raising
# rlimits, and has cgroups v1 with no systemd.
[containers]
default_ulimits = ["nofile=${hard}:${hard}", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
    echo "setup: wrote $conf (nofile ${hard}, runc)"
  fi
fi
podman info --format '{{.Host.OCIRuntime.Name}} {{.Version.Version}}' >/dev/null
