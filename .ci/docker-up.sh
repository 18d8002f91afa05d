#!/usr/bin/env bash
# Run: .ci/docker-up.sh      (fresh Debian/Ubuntu machine: install + start the Docker engine)
# Installs docker.io, docker-compose and debootstrap with apt when missing, then starts
# dockerd in the background (log: /tmp/dockerd.log) unless `docker info` already works.
# Called by .ci/run; safe to rerun.
set -euo pipefail
SUDO=; [[ $EUID -eq 0 ]] || SUDO=sudo
apt_install() { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; }

# Engine (+ compose v1 and debootstrap, both needed by images/build.sh and the launcher).
if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
  apt_install docker.io docker-compose debootstrap
fi
command -v debootstrap >/dev/null || apt_install debootstrap
# Compose: v2 plugin (`docker compose`) preferred; fall back to installing v1 docker-compose.
docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null || apt_install docker-compose

# Start the daemon if it does not answer (no systemd in many CI containers).
if ! $SUDO docker info >/dev/null 2>&1; then
  echo "[docker-up] starting dockerd (log: /tmp/dockerd.log)"
  $SUDO sh -c 'nohup dockerd >/tmp/dockerd.log 2>&1 &'
  for _ in $(seq 60); do $SUDO docker info >/dev/null 2>&1 && break; sleep 1; done
  $SUDO docker info >/dev/null 2>&1 || { echo "dockerd did not come up; see /tmp/dockerd.log" >&2; tail -20 /tmp/dockerd.log >&2; exit 1; }
fi
echo "[docker-up] docker engine $($SUDO docker info -f '{{.ServerVersion}}') is up"
