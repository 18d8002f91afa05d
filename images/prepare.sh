#!/usr/bin/env bash
# Run: bash images/prepare.sh && docker-compose up      (or: docker compose up)
# Readies a machine, fresh or not, for `docker compose up` on the checked-in docker-compose.yml:
# the Docker engine (.ci/docker-up.sh), the trainer image (images/build.sh, offline when no
# registry answers) and the run folder the 2x2x2 cluster writes to (runs/mesh-2x2x2, owned by the
# containers' user 1000:1000, mode 0755). Idempotent: a second run takes seconds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash .ci/docker-up.sh
bash images/build.sh
SUDO=; [[ $EUID -eq 0 ]] || SUDO=sudo
mkdir -p runs/mesh-2x2x2
chmod 0755 runs/mesh-2x2x2
$SUDO chown 1000:1000 runs/mesh-2x2x2
echo "[prepare] ready: docker-compose up   (or: docker compose up, or: python -m launcher up --mesh 2x2x2)"
