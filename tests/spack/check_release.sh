#!/usr/bin/env bash
# ctest spack.release: Spack/checksum-release.sh on a tag cut in a throwaway clone of this source
# tree. The tarball holds the tag's tree under zerotrain-X.Y.Z/, the same tag gives the same bytes
# twice, the printed sha256 is the tarball's, and the printed version line (with a file:// url to
# that tarball) passes the recipe check in a copy of the recipe. Prints "PASS: release"; exits 77
# after "SKIPPED: ..." where the source is not a git checkout.
# usage: check_release.sh SOURCE_DIR WORK_DIR PYTHON3
set -euo pipefail
source_dir=$1 work=$2 python=$3
script=$source_dir/Spack/checksum-release.sh
fail() {
  echo "FAIL: $*"
  exit 1
}
git -C "$source_dir" rev-parse --verify -q HEAD >/dev/null 2>&1 || {
  echo "SKIPPED: $source_dir is not a git checkout (a release is cut from one)"
  exit 77
}
rm -rf "$work"
mkdir -p "$work"
git clone -q --no-local "$source_dir" "$work/clone"
cd "$work/clone"
tag=v9.8.7
git -c user.name=zerotrain-test -c user.email=test@localhost tag -a "$tag" -m "release test"

# No such tag: a usage error that names it.
if missing=$(bash "$script" v0.0.0-none "$work/none" 2>&1); then fail "a missing tag was accepted"; fi
grep -q "no tag 'v0.0.0-none'" <<<"$missing" || fail "missing tag: unexpected message: $missing"

out=$(bash "$script" "$tag" "$work/a")
tarball=$work/a/zerotrain-9.8.7.tar.gz
[ -f "$tarball" ] || fail "no $tarball; the script said: $out"
line=$(grep -E '^    version\("9\.8\.7", sha256="[0-9a-f]{64}"\)$' <<<"$out") || fail "no version line in: $out"
printed=$(sed -E 's/.*sha256="([0-9a-f]+)".*/\1/' <<<"$line")
actual=$("$python" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$tarball")
[ "$printed" = "$actual" ] || fail "printed sha256 $printed, the tarball's is $actual"

bash "$script" "$tag" "$work/b" >/dev/null
cmp -s "$tarball" "$work/b/zerotrain-9.8.7.tar.gz" || fail "the same tag gave different tarballs"

listing=$(tar -tzf "$tarball")
for member in CMakeLists.txt Spack/spack_repo/zerotrain/packages/zerotrain/package.py jobscripts/pbs.sh; do
  grep -qx "zerotrain-9.8.7/$member" <<<"$listing" || fail "the tarball has no zerotrain-9.8.7/$member"
done
if grep -v '^zerotrain-9\.8\.7/' <<<"$listing" | grep -q .; then fail "members outside zerotrain-9.8.7/"; fi

# The line as it goes into the recipe, here with the tarball's own file:// url.
recipe=$work/package.py
sed "s|^    # version(\"0.1.0\", sha256=.*|${line%)}, url=\"file://$tarball\")|" \
  "$source_dir/Spack/spack_repo/zerotrain/packages/zerotrain/package.py" >"$recipe"
grep -q "version(\"9.8.7\", sha256=\"$actual\", url=\"file://" "$recipe" || fail "the version line did not go into the copy"
"$python" "$source_dir/tests/spack/check_recipe.py" "$source_dir" --recipe "$recipe" || fail "the recipe with the line fails the check"
echo "PASS: release ($line)"
