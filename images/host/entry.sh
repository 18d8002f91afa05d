#!/bin/sh
# Run: the entry point of images/host (a rehearsal host): docker run ... simcluster/host:latest
# Starts Debian's registry on :5000 when SIMCLUSTER_REGISTRY=1 (host-0), then execs dockerd with
# its API on the unix socket and on tcp :2375 (published to this machine's 127.0.0.1 only), and
# host-0:5000 trusted as an insecure registry (the rehearsal's private network; real hosts use TLS).
set -e
# /var/lib/docker is a volume kept between rehearsals for its image cache; the rest of the engine's state
# starts fresh: an earlier rehearsal's swarm, containers and networks (a restored network may overlap the
# address this host has now on the hosts' bridge, which would cut it off)
rm -rf /var/lib/docker/swarm /var/lib/docker/network /var/lib/docker/containers
if [ "${SIMCLUSTER_REGISTRY:-0}" = 1 ]; then
  mkdir -p /var/lib/docker-registry
  docker-registry serve /etc/simcluster/registry.yml >/var/log/registry.log 2>&1 &
fi
exec dockerd --host unix:///var/run/docker.sock --host tcp://0.0.0.0:2375 \
  --insecure-registry "${SIMCLUSTER_REGISTRY_ADDR:-host-0:5000}" --storage-driver overlay2 "$@"
