#!/bin/sh
# Build the multicard image with its provenance: the base pinned by the digest just pulled, the
# git commit, the source and the date, as OCI labels and in every run's env.json.
#   containers/build.sh [docker|podman] [TAG] [more build options ...]
# MULTICARD_BASE names another base (a local one, e.g. `nox -s container`'s stand-in, is not
# pulled); EXPECTED_VERSIONS then names what requirements/check_image.py expects of it.
set -eu
engine=${1:-docker}
tag=${2:-multicard}
[ $# -gt 0 ] && shift
[ $# -gt 0 ] && shift
cd "$(dirname "$0")/.."
base=${MULTICARD_BASE:-$(sed -n 's/^base_image = "\(.*\)"/\1/p' requirements/image.toml)}
case "$base" in
    localhost/*) ;;
    *) "$engine" pull "$base" ;;
esac
digest=$("$engine" image inspect --format '{{if .RepoDigests}}{{index .RepoDigests 0}}{{end}}' "$base")
case "$digest" in
    *@sha256:*) digest=${digest#*@} ;;
    *) echo "build: no digest for $base: it is recorded as not pinned" >&2; digest= ;;
esac
sha=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$sha" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    sha="$sha+dirty"  # the image holds changes no commit has
fi
# a credential in the remote's URL stays out of the labels
source=$(git remote get-url origin 2>/dev/null | sed 's#://[^/@]*@#://#' || true)
source=${source:-unknown}
exec "$engine" build \
    --build-arg BASE_IMAGE="$base" \
    --build-arg BASE_DIGEST="$digest" \
    --build-arg EXPECTED_VERSIONS="${EXPECTED_VERSIONS:-requirements/image.toml}" \
    --build-arg MULTICARD_GIT_SHA="$sha" \
    --build-arg MULTICARD_SOURCE="$source" \
    --build-arg MULTICARD_CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    "$@" -t "$tag" -f Dockerfile .
