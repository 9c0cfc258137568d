#!/usr/bin/env bash
# Build the pinmq image (pinmq:latest) on a machine that reaches PyPI and its Debian mirror but
# maybe no image registry.
#
#  1. A wheelhouse on the host, in a build context of its own (a temporary directory: two
#     builds at once never share one): pip inside a container may not reach PyPI (TLS
#     interception), so the image installs these with --no-index.
#  2. The base image: the public BASE (python:3.11-slim-bookworm) if the engine has it or can
#     pull it; else pinmq-base:<release>, built once by debootstrap of this machine's Debian
#     release from the mirror in its apt sources (python3, python3-venv, ca-certificates) and
#     `docker import`. debootstrap is installed with apt-get when missing.
#  3. docker build -f deploy/Dockerfile --build-arg BASE=<that base>, one build at a time on
#     the engine (a lock file in $TMPDIR).
#
# With KIND spark it builds the Spark image instead (pinmq-spark:latest, $PINMQ_SPARK_IMAGE):
# deploy/spark.Dockerfile, from a wheelhouse of pinmq[check] (PySpark: Spark's jars), on the
# same base; its JRE comes from the base's apt sources inside the build.
#
# Usage: deploy/build-image.sh [PYTHON] [node|spark]   (PYTHON: the interpreter whose pip builds
# the wheels; default .venv/bin/python). Prints each step; exits non-zero naming the step that
# failed.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${1:-.venv/bin/python}
KIND=${2:-node}
case "$KIND" in
  node) IMAGE=${PINMQ_IMAGE:-pinmq:latest} DOCKERFILE=deploy/Dockerfile REQUIREMENT="" ;;
  spark) IMAGE=${PINMQ_SPARK_IMAGE:-pinmq-spark:latest} DOCKERFILE=deploy/spark.Dockerfile REQUIREMENT="[check]" ;;
  *) printf 'build-image: KIND is node or spark, not %s\n' "$KIND" >&2; exit 2 ;;
esac
PUBLIC_BASE=python:3.11-slim-bookworm
CONTEXT=$(mktemp -d /tmp/pinmq-image.XXXXXX)
SOURCE=$(mktemp -d /tmp/pinmq-source.XXXXXX)  # pip builds a copy: setuptools leaves build/ behind
trap 'rm -rf "$CONTEXT" "$SOURCE"' EXIT
WHEELS=$CONTEXT/wheelhouse

step() { printf '==> %s\n' "$*"; }
fail() { printf 'build-image: %s\n' "$*" >&2; exit 1; }

docker info >/dev/null 2>&1 || fail "no Docker engine answers (docker info failed)"

step "wheelhouse: pinmq$REQUIREMENT and its dependencies"
# The same source gives the same wheelhouse, to the file times (those of the last commit), so
# an unchanged tree rebuilds from docker's layer cache.
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 315532800)
tar -c --exclude=./.git --exclude=./.venv --exclude=./.bench --exclude=./data --exclude=./run \
  --exclude=./secrets --exclude=./build --exclude='*.egg-info' --exclude=__pycache__ . \
  | tar -x -C "$SOURCE" || fail "cannot copy the source tree"
SOURCE_DATE_EPOCH=$epoch "$PYTHON" -m pip wheel -q --wheel-dir "$WHEELS" "$SOURCE$REQUIREMENT" \
  || fail "pip wheel failed"
find "$CONTEXT" -exec touch -h -d "@$epoch" {} +

# One build at a time on this engine (two test workers, two checkouts): a build's closing prune
# removed the image another build was about to tag ("failed to get digest"), and two first
# builds would both debootstrap the base.
exec 9>>"${TMPDIR:-/tmp}/pinmq-build-image.lock"
flock -n 9 || { step "waiting for another image build on this engine"; flock 9; }

# The release and mirror this machine's apt uses: deb822 sources first, then sources.list.
release() { . /etc/os-release && printf '%s' "${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}"; }
mirror() {
  local uri
  uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -n1 || true)
  [ -n "$uri" ] || uri=$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | grep -v security | head -n1 || true)
  printf '%s' "${uri:-http://deb.debian.org/debian}"
}

local_base() {
  local name tag root
  tag=$(release)
  name="pinmq-base:$tag"
  if docker image inspect "$name" >/dev/null 2>&1; then
    printf '%s' "$name"
    return
  fi
  command -v debootstrap >/dev/null || {
    step "installing debootstrap (apt-get)" >&2
    { apt-get update -q && apt-get install -y -q debootstrap; } >&2 || fail "cannot install debootstrap"
  }
  root=$(mktemp -d /tmp/pinmq-base.XXXXXX)
  trap 'rm -rf "$root"' RETURN
  step "base image $name: debootstrap $tag from $(mirror) (about a minute)" >&2
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$tag" "$root" "$(mirror)" >&2 || fail "debootstrap failed"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import - "$name" >/dev/null || fail "docker import failed"
  printf '%s' "$name"
}

if docker image inspect "$PUBLIC_BASE" >/dev/null 2>&1 \
  || timeout 20 docker pull -q "$PUBLIC_BASE" >/dev/null 2>&1; then
  BASE=$PUBLIC_BASE
else
  step "no registry answers: a local base image"
  BASE=$(local_base)
fi

step "image $IMAGE from $BASE"
log=$(mktemp /tmp/pinmq-build.XXXXXX)
docker build -f "$DOCKERFILE" --build-arg "BASE=$BASE" -t "$IMAGE" "$CONTEXT" >"$log" 2>&1 \
  || { tail -n 30 "$log" >&2; rm -f "$log"; fail "docker build failed"; }
rm -f "$log"
# Untagged images of ours: the build stage (wheels and pip), and an image this one replaced.
docker image prune -f --filter label=org.pinmq.image=true >/dev/null
size=$(docker image inspect -f '{{.Size}}' "$IMAGE")
step "built $IMAGE: $((size / 1000000)) MB"
