#!/usr/bin/env bash
# scripts/release.sh VERSION [OUT]: builds release VERSION (vMAJOR.MINOR.PATCH,
# optionally -PRERELEASE) of kvrouter, without make:
#   OUT/kvrouter-VERSION-linux-amd64, OUT/kvrouter-VERSION-linux-arm64
#       static binaries (CGO_ENABLED=0, -trimpath), the version stamped with
#       -ldflags "-X main.version=VERSION" (kvrouter version prints it);
#   OUT/SHA256SUMS;
#   the image $IMAGE:VERSION (IMAGE defaults to kvrouter) from the
#       Dockerfile, with docker or podman when one can build here (a
#       reachable daemon for docker); otherwise it says so and stops at the
#       binaries. CONTAINER=docker|podman|none chooses.
# OUT defaults to dist/. A release (not --snapshot) also checks that
# CHANGELOG.md has a "## VERSION - YYYY-MM-DD" heading, that
# deploy/kustomization.yaml's image tag is VERSION (what is tagged is what
# the manifests run) and, in a git checkout, that it has no uncommitted
# or untracked file (what is built is a commit). "--snapshot VERSION"
# skips the three (test builds).
# The build flags are the Dockerfile's (cmd/kvrouter TestReleaseScript and
# TestDockerfileBuild check both).
set -euo pipefail
cd "$(dirname "$0")/.."

snapshot=0
if [ "${1:-}" = "--snapshot" ]; then
  snapshot=1
  shift
fi
version=${1:-}
out=${2:-dist}
if ! [[ $version =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "usage: scripts/release.sh [--snapshot] vMAJOR.MINOR.PATCH[-PRERELEASE] [OUT]; got ${version:-nothing}" >&2
  exit 2
fi

if [ $snapshot = 0 ]; then
  if ! grep -Eq "^## ${version//./\\.} - [0-9]{4}-[0-9]{2}-[0-9]{2}\$" CHANGELOG.md; then
    echo "CHANGELOG.md has no \"## $version - YYYY-MM-DD\" heading: move the Unreleased bullets under one first" >&2
    exit 1
  fi
  if ! grep -Eq "^  newTag: ${version//./\\.}\$" deploy/kustomization.yaml; then
    echo "deploy/kustomization.yaml's images: newTag is not $version: set it first" >&2
    exit 1
  fi
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && [ -n "$(git status --porcelain)" ]; then
    echo "the checkout has uncommitted or untracked files: a release is built from a commit (git status; --snapshot builds anyway)" >&2
    exit 1
  fi
fi
start=$SECONDS

mkdir -p "$out"
for arch in amd64 arm64; do
  bin="$out/kvrouter-$version-linux-$arch"
  echo "== go build linux/$arch -> $bin"
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch \
    go build -trimpath -ldflags="-s -w -X main.version=$version" -o "$bin" ./cmd/kvrouter
done
(cd "$out" && sha256sum kvrouter-"$version"-linux-* > SHA256SUMS)

image=${IMAGE:-kvrouter}:$version
engine=${CONTAINER:-}
if [ -z "$engine" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    engine=docker
  elif command -v podman >/dev/null && podman info >/dev/null 2>&1; then
    engine=podman
  else
    engine=none
  fi
fi
if [ "$engine" = none ]; then
  echo "== no docker daemon or podman here: image $image not built (binaries only)"
else
  echo "== $engine build $image"
  "$engine" build --build-arg VERSION="$version" -t "$image" .
fi
echo "== release $version in $((SECONDS - start)) s: $(ls "$out" | tr '\n' ' ')"
if [ $snapshot = 0 ]; then
  echo "== tag it: git tag -a $version -m \"kvrouter $version\" && git push origin $version"
fi
