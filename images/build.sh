#!/usr/bin/env bash
# Run: images/build.sh [--force] [--offline] [--nettools | --trainer]   (from any cwd; = python -m simcluster build)
# env BASE_IMAGE=img overrides the base; SIMCLUSTER_IMAGE=name:tag the trainer image's name.
# Builds simcluster/trainer:latest, then simcluster/nettools:latest (iproute2, for
# --inter-node-bandwidth; apt over http; a failure there only warns). --nettools builds just that one. If a registry answers, on python:3.11-slim; otherwise
# offline: a debootstrapped Debian base (simcluster/base:bookworm) + a wheelhouse made on
# the host with pip download. Idempotent: reruns reuse the base, the wheelhouse and the
# docker layer cache. --force rebuilds all three; --offline skips the registry probe.
# Runs from a checkout or from the installed package (python -m simcluster build): the context is
# staged in a temporary folder (requirements.txt, wheelhouse/, simcluster/ = this installation's
# code, from simcluster.launcher.job.files.stage_code), so the image is the same either way.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."          # SOURCE: the checkout's root, or site-packages/simcluster

IMAGE=${SIMCLUSTER_IMAGE:-simcluster/trainer:latest}
LOCAL_BASE=simcluster/base:bookworm
PY=${PYTHON:-$(command -v python3 || command -v python)}
# The wheelhouse: images/wheelhouse in a checkout; a user cache for an installed package (its folder
# in site-packages is not the place for 200 MB of wheels).
if [[ -f pyproject.toml ]]; then WHEELHOUSE=images/wheelhouse
else WHEELHOUSE=${SIMCLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/simcluster}/wheelhouse; fi
mkdir -p "$WHEELHOUSE"
TORCH_INDEX=${TORCH_INDEX:-}   # optional extra index for torch (e.g. the PyTorch CPU index)
FORCE=0 OFFLINE=0 NETTOOLS_ONLY=0 TRAINER_ONLY=0
NETTOOLS_IMAGE=simcluster/nettools:latest
for arg in "$@"; do
  case $arg in
    --force) FORCE=1 ;;
    --offline) OFFLINE=1 ;;
    --nettools) NETTOOLS_ONLY=1 ;;
    --trainer) TRAINER_ONLY=1 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done
docker info >/dev/null 2>&1 || {
  echo "build.sh: no Docker engine answers (docker info failed); start one first: sudo bash .ci/docker-up.sh" >&2
  exit 1
}
t0=$(date +%s)
say() { echo "[build.sh +$(( $(date +%s) - t0 ))s] $*"; }

# --- the network helper image: FROM the local base when there is one --------------------------
build_nettools() {
  local nb=${BASE_IMAGE:-}
  [[ -z $nb ]] && { docker image inspect "$LOCAL_BASE" >/dev/null 2>&1 && nb=$LOCAL_BASE || nb=python:3.11-slim; }
  say "docker build $NETTOOLS_IMAGE (FROM $nb)"
  docker build --build-arg BASE_IMAGE="$nb" -t "$NETTOOLS_IMAGE" - < images/nettools.Dockerfile \
    && docker run --rm "$NETTOOLS_IMAGE" tc -V
}
if (( NETTOOLS_ONLY )); then
  build_nettools
  exit
fi

# --- choose the base image -------------------------------------------------------------
if [[ -n ${BASE_IMAGE:-} ]]; then
  base=$BASE_IMAGE
elif (( !OFFLINE )) && timeout 20 docker pull -q python:3.11-slim >/dev/null 2>&1; then
  base=python:3.11-slim
else
  base=$LOCAL_BASE OFFLINE=1
fi
say "base image: $base"

# --- (a) offline base: minimal Debian bookworm rootfs with python3 + venv, imported ------
build_local_base() {
  command -v debootstrap >/dev/null || { echo "need debootstrap: apt-get install -y debootstrap" >&2; exit 1; }
  ROOTFS=$(mktemp -d /tmp/simcluster-rootfs.XXXXXX)  # global: the EXIT trap runs after this function returns
  local root=$ROOTFS
  trap 'rm -rf "$ROOTFS"' EXIT
  say "debootstrap bookworm into $root (a few minutes)"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd \
    bookworm "$root" http://deb.debian.org/debian
  # Trim: apt caches/lists, docs, man pages, locales, logs; keep later apt installs doc-free.
  chroot "$root" apt-get clean
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/* \
         "$root"/usr/share/{doc,man,info,locale,lintian}/* "$root"/tmp/*
  printf 'path-exclude /usr/share/%s/*\n' doc man info locale >"$root"/etc/dpkg/dpkg.cfg.d/01-nodoc
  tar -C "$root" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -c . |
    docker import \
      -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/bash"]' - "$LOCAL_BASE" >/dev/null
  rm -rf "$root"; trap - EXIT
}
if [[ $base == "$LOCAL_BASE" ]] && { (( FORCE )) || ! docker image inspect "$LOCAL_BASE" >/dev/null 2>&1; }; then
  build_local_base
fi

# --- (b) offline wheelhouse: wheels for the container (cp311, manylinux x86_64) ----------
# Stamp = hash of requirements.txt, so an unchanged, complete wheelhouse is not re-downloaded.
if (( OFFLINE )) || [[ $base == "$LOCAL_BASE" ]]; then
  stamp=$WHEELHOUSE/.complete
  want=$(sha256sum images/requirements.txt | cut -c1-64)
  if (( FORCE )) || [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    say "pip download -> $WHEELHOUSE"
    rm -f "$WHEELHOUSE"/*.whl "$stamp"
    # torch==2.13.0 comes from pip's find-links (a CPU wheel on disk) or, when set, $TORCH_INDEX.
    idx=(); [[ -n $TORCH_INDEX ]] && idx=(--extra-index-url "$TORCH_INDEX")
    "$PY" -m pip download -q -r images/requirements.txt -d "$WHEELHOUSE" "${idx[@]}" --only-binary=:all: \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
      --platform manylinux_2_17_x86_64 --python-version 3.11 --implementation cp --abi cp311
    # A CUDA torch would be several GB: insist on the +cpu build.
    ls "$WHEELHOUSE"/torch-*+cpu-*.whl >/dev/null 2>&1 || { echo "wheelhouse has no CPU torch wheel" >&2; exit 1; }
    echo "$want" >"$stamp"
  fi
fi

# --- (c) the trainer image ----------------------------------------------------------------
nocache=(); (( FORCE )) && nocache=(--no-cache)
ctx=$(mktemp -d "$(dirname "$WHEELHOUSE")/.context.XXXXXX")   # beside the wheelhouse: hard links work
trap 'rm -rf "$ctx"' EXIT
cp images/Dockerfile images/requirements.txt "$ctx/"
cp -al "$WHEELHOUSE" "$ctx/wheelhouse" 2>/dev/null || cp -a "$WHEELHOUSE" "$ctx/wheelhouse"
rm -f "$ctx/wheelhouse/.complete"
# The code and its digest come from the package the interpreter imports: `launcher up` compares the
# label with simcluster.launcher.job.files.code_digest() (content, not mtimes).
digest=$("$PY" -c 'import sys; from simcluster.launcher.job.files import code_digest, stage_code
stage_code(sys.argv[1]); print(code_digest())' "$ctx")
say "docker build $IMAGE (code digest ${digest:0:12})"
docker build "${nocache[@]}" --build-arg BASE_IMAGE="$base" ${TORCH_INDEX:+--build-arg TORCH_INDEX="$TORCH_INDEX"} \
  --label io.simcluster.code-digest="$digest" -t "$IMAGE" "$ctx"
rm -rf "$ctx"; trap - EXIT

# --- final check and summary ---------------------------------------------------------------
docker run --rm "$IMAGE" python -c "import torch, yaml, numpy; print('image ok: torch', torch.__version__, 'yaml', yaml.__version__, 'numpy', numpy.__version__)"
size=$(docker image inspect -f '{{.Size}}' "$IMAGE")
say "image $IMAGE size: $size bytes ($(( size / 1000000 )) MB)"
say "build time: $(( $(date +%s) - t0 )) s"
(( TRAINER_ONLY )) || build_nettools || say "warning: $NETTOOLS_IMAGE not built (apt failed?): --inter-node-bandwidth needs it"
