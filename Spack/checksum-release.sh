#!/usr/bin/env bash
# Makes the release tarball of a tag and prints the recipe's version line for it (docs/spack.md,
# "Releases"). Run in a zerotrain checkout after `git tag -a vX.Y.Z -m "zerotrain X.Y.Z"`:
#   Spack/checksum-release.sh vX.Y.Z [OUT_DIR]
# writes OUT_DIR/zerotrain-X.Y.Z.tar.gz (default OUT_DIR: .), a `git archive` of the tag with the
# top directory zerotrain-X.Y.Z/, compressed without a name or time stamp so that the same tag gives
# the same bytes, and prints
#   version("X.Y.Z", sha256="...")
# for Spack/spack_repo/zerotrain/packages/zerotrain/package.py. Publish that very file (the
# checksum is of its bytes): a forge's own on-the-fly archive of the tag may differ byte for byte.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 vX.Y.Z [OUT_DIR]" >&2
  exit 2
fi
tag=$1
out_dir=${2:-.}
if ! git rev-parse -q --verify "refs/tags/$tag^{commit}" >/dev/null; then
  echo "$0: no tag '$tag' in $(git rev-parse --show-toplevel 2>/dev/null || pwd) (git tag -a $tag -m ...)" >&2
  exit 2
fi
version=${tag#v}
name=zerotrain-$version
mkdir -p "$out_dir"
tarball=$out_dir/$name.tar.gz
git archive --format=tar --prefix="$name/" "$tag" | gzip -9 -n >"$tarball"
sha256=$(sha256sum "$tarball" | cut -d ' ' -f 1)
echo "tarball: $tarball"
echo "    version(\"$version\", sha256=\"$sha256\")"
