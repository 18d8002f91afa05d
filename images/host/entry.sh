#!/bin/sh
# Run: the entry point of images/host (a rehearsal host): docker run ... simcluster/host:latest
# Starts Debian's registry on :5000 when SIMCLUSTER_REGISTRY=1 (host-0), then execs dockerd with
# its API on the unix socket and on tcp :2375 (published to this machine's 127.0.0.1 only), and
# host-0:5000 trusted as an insecure registry (the rehearsal's private network; real hosts use TLS).
set -e
# /var/lib/docker is a volume kept between rehearsals (the image cache): a swarm of an earlier one is not joined
rm -rf /var/lib/docker/swarm
if [ "${SIMCLUSTER_REGISTRY:-0}" = 1 ]; then
  mkdir -p /var/lib/docker-registry
  docker-registry serve /etc/simcluster/registry.yml >/var/log/registry.log 2>&1 &
fi
exec dockerd --host unix:///var/run/docker.sock --host tcp://0.0.0.0:2375 \
  --insecure-registry "${SIMCLUSTER_REGISTRY_ADDR:-host-0:5000}" --storage-driver overlay2 "$@"
