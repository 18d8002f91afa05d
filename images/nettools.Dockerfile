# Run: bash images/build.sh   (builds simcluster/nettools:latest after the trainer image)
# The helper that shapes a node's network (launcher/shaping.py): Debian + iproute2 (tc), started
# as root with NET_ADMIN in a node container's network namespace for the second tc needs.
ARG BASE_IMAGE=simcluster/base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update -o Acquire::Retries=3 \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iproute2 \
 && rm -rf /var/lib/apt/lists/*
CMD ["tc", "-s", "qdisc", "show", "dev", "eth0"]
