#!/bin/sh
# Builds the ledgerkeeper release binary: static (CGO off), with the time zone
# database embedded, and stamped with its version. The Dockerfile's build
# stage and .ci/run both call this, so the flags CI checks on the host are the
# flags the image is built with.
#
#     deploy/build.sh [OUTPUT]        # default bin/ledgerkeeper
#
# The version (internal/version) comes from, in order:
#   $VERSION   (docker build --build-arg VERSION=...; there is no git in the image build)
#   git describe --tags --exclude 'ledger/*' --always --dirty, when run in a git work tree
#              (ledger/vX.Y.Z tags version the tool side's module, not the daemon)
#   nothing: the binary then reports the VCS revision the Go toolchain recorded, or "unknown".
# The revision likewise from $REVISION, then git rev-parse HEAD.
# GOOS, GOARCH and GOFLAGS are passed through to go build.
set -eu
cd "$(dirname "$0")/.."
out=${1:-bin/ledgerkeeper}

in_git() { command -v git >/dev/null 2>&1 && git rev-parse --is-inside-work-tree >/dev/null 2>&1; }

version=${VERSION:-}
revision=${REVISION:-}
if in_git; then
  [ -n "$version" ] || version=$(git describe --tags --exclude 'ledger/*' --always --dirty)
  [ -n "$revision" ] || revision=$(git rev-parse HEAD)
fi

pkg=github.com/ledgerkeeper/ledgerkeeper/internal/version
ldflags="-s"
[ -z "$version" ] || ldflags="$ldflags -X $pkg.Version=$version"
[ -z "$revision" ] || ldflags="$ldflags -X $pkg.Revision=$revision"

# timetzdata: the image has no /usr/share/zoneinfo (FROM scratch), and TZ or
# a CRON_TZ= schedule must still resolve.
CGO_ENABLED=0 exec go build -trimpath -tags timetzdata -ldflags "$ldflags" -o "$out" ./cmd/ledgerkeeper
