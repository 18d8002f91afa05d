#!/usr/bin/env bash
# Run: bash images/prepare.sh && docker-compose up      (or: docker compose up)
# Readies a machine, fresh or not, for `docker compose up` on the checked-in docker-compose.yml:
# the Docker engine (.ci/docker-up.sh), the trainer image (images/build.sh, offline when no
# registry answers) and the run folder the 2x2x2 cluster writes to (runs/mesh-2x2x2, writable by
# the containers' uid 1000). Idempotent: a second run takes seconds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash .ci/docker-up.sh
bash images/build.sh
mkdir -p runs/mesh-2x2x2
chmod 1777 runs runs/mesh-2x2x2
echo "[prepare] ready: docker-compose up   (or: docker compose up, or: python -m launcher up --mesh 2x2x2)"
