#!/usr/bin/env bash
# The GPU checks as a bundle for a GPU machine that lacks our Debian packages (the device tool's H200:
# CUDA 13, PyTorch's pip CUDA libraries, no Open MPI, HDF5, OpenBLAS or GoogleTest, no network).
# docs/gpu.md, "Running the GPU checks".
#
#   scripts/gpu-bundle.sh [pack]      configure and build a CUDA build (ZT_GPU_BUILD_DIR, default
#                                     build-gpu; sm_${ZT_CUDA_ARCH:-90}; ccache when installed), only the
#                                     targets of zt_gpu_checks and the GPU benchmarks, then pack them with
#                                     the libraries the image lacks into .gpu-bundle/zt-gpu-bundle.tar.xz
#   scripts/gpu-bundle.sh stage DIR   the same, unpacked into DIR (no archive): scripts/gpu-check.sh's
#                                     fallback on a machine that has the Debian packages
#   scripts/gpu-bundle.sh --check [ARCHIVE]
#                                     verify a bundle here, without a GPU: every binary and library
#                                     resolves inside the bundle (CUDA from /usr/local/cuda standing in
#                                     for the image's pip packages), mpirun -n 2 and a singleton relocated
#                                     with the host's Open MPI directories hidden, and the test runner
#                                     reporting every GPU test skipped for want of a GPU
# Inside an unpacked bundle (its copy of this script):
#   BUNDLE/gpu-bundle.sh exec CMD...  CMD with the bundle's environment (LD_LIBRARY_PATH, PATH, OPAL_*,
#                                     PMIX_*), set for CMD only, so that the image's python3 is untouched
#   BUNDLE/gpu-bundle.sh tests SUMMARY [LOG]
#                                     every GPU test (ctest label gpu, listed at pack time in tests.list)
#                                     with ctest's pass/skip rules; one line per test in SUMMARY, their
#                                     output in LOG; exits 1 when a test failed
#
# What is not bundled: glibc (every image has it), libcuda (the driver; we never link it) and the CUDA
# libraries the image has as pip packages (cudart, cuBLAS/cuBLASLt, cuDNN, NCCL, nvrtc, ...): `exec`
# finds them under python3's site-packages/nvidia/*/lib (or ZT_CUDA_LIBRARY_DIRS, colon-separated).
# libstdc++ and libgcc_s travel in lib/fallback, used only when the image's are missing or too old.
set -euo pipefail

bundle_name=zt-gpu-bundle
max_archive_mib=60
# Sonames the image provides: the driver, and the pip packages nvidia-cuda-runtime, nvidia-cublas,
# nvidia-cudnn-cu13, nvidia-nccl-cu13, nvidia-cuda-nvrtc, nvidia-nvjitlink, nvidia-cufft, ...
cuda_soname_regex='^lib(cuda|nvidia-[a-z-]+|cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|nvrtc[a-z-]*|nvJitLink|cufft|curand|cusparse|cusolver|cupti|nvToolsExt)\.so'
# glibc: on every image, never bundled.
system_soname_regex='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libanl\.so|libmvec\.so)'
# The C++ runtime: bundled in lib/fallback.
fallback_soname_regex='^(libstdc\+\+\.so|libgcc_s\.so)'
# Open MPI components that need fabric libraries (UCX, libfabric, verbs, PSM) stay behind; the bundle's
# environment selects pml ob1 with the shared-memory and TCP transports.
fabric_soname_regex='^lib(ucp|ucs|uct|ucm|fabric|ibverbs|rdmacm|efa|psm2|psm_infinipath|infinipath|nl-3|nl-route-3)\.so'

fail() {
  echo "gpu-bundle: FAIL: $*" >&2
  exit 1
}
note() { echo "gpu-bundle: $*"; }

# ---------------------------------------------------------------------------------------------------
# Inside a bundle: the environment, the runner.

bundle_root() { # the unpacked bundle this script lives in
  local here
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  [ -f "$here/MANIFEST" ] || fail "$here is not an unpacked bundle (no MANIFEST); use scripts/gpu-bundle.sh [pack|--check]"
  echo "$here"
}

# The directories of the image's CUDA libraries: ZT_CUDA_LIBRARY_DIRS, else python3's
# site-packages/nvidia/*/lib (nvidia/cu13/lib: cudart, cuBLAS; nvidia/cudnn/lib; nvidia/nccl/lib), then
# the toolkit's lib64 for what pip lacks. Run with the caller's environment, before ours.
cuda_library_dirs() {
  if [ -n "${ZT_CUDA_LIBRARY_DIRS:-}" ]; then
    echo "$ZT_CUDA_LIBRARY_DIRS"
    return
  fi
  local dirs=""
  if command -v python3 >/dev/null; then
    dirs=$(python3 - <<'EOF' 2>/dev/null || true
import glob, os, site, sysconfig
roots = []
try:
    import nvidia  # a namespace package: one entry per site-packages that has nvidia/
    roots += list(nvidia.__path__)
except ImportError:
    pass
paths = sysconfig.get_paths()
for base in [paths.get("purelib"), paths.get("platlib")] + list(site.getsitepackages()):
    if base:
        roots.append(os.path.join(base, "nvidia"))
seen = []
for root in roots:
    for lib in sorted(glob.glob(os.path.join(root, "*", "lib"))):
        lib = os.path.realpath(lib)
        if os.path.isdir(lib) and lib not in seen:
            seen.append(lib)
print(":".join(seen))
EOF
    )
  fi
  local toolkit=${CUDA_HOME:-/usr/local/cuda}
  for lib in "$toolkit/lib64" "$toolkit/lib"; do
    [ -d "$lib" ] && dirs="${dirs:+$dirs:}$lib"
  done
  echo "$dirs"
}

# Fills the array bundle_environment with VAR=value for env(1).
set_bundle_environment() { # BUNDLE
  local b=$1 cuda_dirs ld
  cuda_dirs=$(cuda_library_dirs)
  ld="$b/lib${cuda_dirs:+:$cuda_dirs}"
  # The image's C++ runtime is newer than the one we built with, unless it is missing.
  if LD_LIBRARY_PATH="$ld" ldd "$b/bin/zerotrain" 2>&1 | grep -Eq '(libstdc\+\+|libgcc_s).*not found|GLIBCXX.*not found|GCC_[0-9.]+.*not found'; then
    ld="$ld:$b/lib/fallback"
  fi
  local ompi=$b/ompi pmix
  pmix=$(sed -n 's/^pmix_prefix=//p' "$b/MANIFEST")
  local libdir pkglibdir
  libdir=$ompi/$(sed -n 's/^ompi_libdir=//p' "$b/MANIFEST")
  pkglibdir=$ompi/$(sed -n 's/^ompi_pkglibdir=//p' "$b/MANIFEST")
  bundle_environment=(
    "LD_LIBRARY_PATH=$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    "PATH=$b/bin:$ompi/bin:$PATH"
    # Open MPI relocated (Debian's layout under $ompi); every directory named, since Debian's
    # sysconfdir (/etc/openmpi) is not below its prefix.
    "OPAL_PREFIX=$ompi" "OPAL_EXEC_PREFIX=$ompi" "OPAL_BINDIR=$ompi/bin" "OPAL_SBINDIR=$ompi/bin"
    "OPAL_LIBEXECDIR=$ompi/bin" "OPAL_LIBDIR=$libdir" "OPAL_PKGLIBDIR=$pkglibdir"
    "OPAL_DATAROOTDIR=$ompi/share" "OPAL_DATADIR=$ompi/share" "OPAL_PKGDATADIR=$ompi/share/openmpi"
    "OPAL_SYSCONFDIR=$ompi/etc/openmpi" "OPAL_INCLUDEDIR=$ompi/include" "OPAL_PKGINCLUDEDIR=$ompi/include"
    "OPAL_LOCALSTATEDIR=/var" "OPAL_SHAREDSTATEDIR=/var"
    # PMIx (Open MPI's pmix ext3x component), relocated the same way.
    "PMIX_PREFIX=$ompi/$pmix" "PMIX_LIBDIR=$ompi/$pmix/lib" "PMIX_PKGLIBDIR=$ompi/$pmix/lib/pmix"
    "PMIX_DATADIR=$ompi/$pmix/share" "PMIX_PKGDATADIR=$ompi/$pmix/share/pmix" "PMIX_SYSCONFDIR=$ompi/$pmix/share"
    # No UCX in the bundle: ob1 over shared memory (vader), self and TCP.
    # Shared-memory copies without CMA (process_vm_readv), which a VM or container may refuse.
    "OMPI_MCA_pml=ob1" "OMPI_MCA_btl=self,vader,tcp" "OMPI_MCA_osc=^ucx,pt2pt"
    "OMPI_MCA_btl_vader_single_copy_mechanism=none"
    "OMPI_ALLOW_RUN_AS_ROOT=1" "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
    # hwloc's plugins are not bundled; its core discovers the machine without them.
    "HWLOC_HIDE_ERRORS=2"
  )
}

bundle_exec() { # BUNDLE CMD...
  local b=$1
  shift
  set_bundle_environment "$b"
  exec env "${bundle_environment[@]}" "$@"
}

gpu_count() {
  if [ -n "${ZT_GPU_COUNT:-}" ]; then
    echo "$ZT_GPU_COUNT"
  elif command -v nvidia-smi >/dev/null; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true
  else
    echo 0
  fi
}

# One line of tests.list: NAME TIMEOUT RANKS SKIP_REGEX SKIP_CODE PASS_REGEX FAIL_REGEX ENV... -- CMD...
# with @BIN@ (the bundle's bin), @SRC@ (the source tree: the repository the device tool copied, or
# ZT_SOURCE_DIR) and @MPIEXEC@ (the bundle's mpiexec) in place of the build machine's paths.
run_tests() { # BUNDLE SUMMARY LOG
  local b=$1 summary=$2 log=$3
  local gpus passed=0 failed=0 skipped=0 line
  gpus=$(gpu_count)
  local source_dir=${ZT_SOURCE_DIR:-$PWD}
  local deadline=${ZT_GPU_TESTS_DEADLINE:-0} timeout_cap=${ZT_GPU_TEST_TIMEOUT:-0}
  set_bundle_environment "$b"
  : >"$summary"
  : >"$log"
  echo "# GPU tests from $b ($(grep -c . "$b/tests.list") listed; GPUs seen: $gpus)" >>"$summary"
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    local fields=()
    eval "fields=($line)"
    local name=${fields[0]} timeout=${fields[1]} ranks=${fields[2]} skip_regex=${fields[3]}
    local skip_code=${fields[4]} pass_regex=${fields[5]} fail_regex=${fields[6]}
    local environment=() command=() i=7 arg
    while [ "${fields[$i]}" != -- ]; do
      environment+=("${fields[$i]}")
      i=$((i + 1))
    done
    for arg in "${fields[@]:$((i + 1))}"; do
      arg=${arg//@BIN@/$b/bin}
      arg=${arg//@SRC@/$source_dir}
      arg=${arg//@MPIEXEC@/$b/ompi/bin/mpiexec} # also inside a wrapper's -DCOMMAND=...
      command+=("$arg")
    done
    local item
    for item in "${!environment[@]}"; do
      environment[item]=${environment[item]//@BIN@/$b/bin}
      environment[item]=${environment[item]//@SRC@/$source_dir}
    done
    if [ "$gpus" -ge 1 ] && [ "$ranks" -gt "$gpus" ]; then
      echo "SKIP $name: needs $ranks GPUs (one per rank), this machine has $gpus" >>"$summary"
      skipped=$((skipped + 1))
      continue
    fi
    if [ "$deadline" -gt 0 ] && [ "$(date +%s)" -ge "$deadline" ]; then
      # A failure, not a skip: a GPU test that did not run has not passed (rerun with more time).
      echo "FAIL $name: not run, the time for the tests is up" >>"$summary"
      failed=$((failed + 1))
      continue
    fi
    if [ "$timeout_cap" -gt 0 ] && [ "$timeout" -gt "$timeout_cap" ]; then timeout=$timeout_cap; fi
    if [ "$deadline" -gt 0 ] && [ "$timeout" -gt $((deadline - $(date +%s))) ]; then
      timeout=$((deadline - $(date +%s)))
      [ "$timeout" -ge 1 ] || timeout=1 # timeout 0 would mean none
    fi
    local work output status began seconds
    work=$(mktemp -d "${TMPDIR:-/tmp}/zt-gpu-test.XXXXXX")
    began=$(date +%s.%N)
    set +e
    output=$(cd "$work" && env "${bundle_environment[@]}" "${environment[@]}" \
      timeout --kill-after=10 "$timeout" "${command[@]}" 2>&1 </dev/null) # mpirun would read tests.list
    status=$?
    set -e
    seconds=$(awk -v a="$began" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    rm -rf "$work"
    {
      echo "===== $name (exit $status, $seconds s): ${command[*]}"
      echo "$output"
    } >>"$log"
    local verdict reason=""
    if [ "$status" = 124 ] || [ "$status" = 137 ]; then
      verdict=FAIL reason="timed out after $timeout s"
    elif [ -n "$skip_regex" ] && grep -Eq -- "$skip_regex" <<<"$output"; then
      verdict=SKIP reason=$(grep -Eo -m1 -- ".{0,60}($skip_regex).{0,60}" <<<"$output" | head -1)
    elif [ -n "$skip_code" ] && [ "$status" = "$skip_code" ]; then
      verdict=SKIP reason="exit $status: $(tail -1 <<<"$output")"
    elif [ -n "$fail_regex" ] && grep -Eq -- "$fail_regex" <<<"$output"; then
      verdict=FAIL reason="output matches /$fail_regex/"
    elif [ -n "$pass_regex" ]; then
      if grep -Eq -- "$pass_regex" <<<"$output"; then verdict=PASS; else verdict=FAIL reason="no /$pass_regex/ in the output"; fi
    elif [ "$status" = 0 ]; then
      verdict=PASS
    else
      verdict=FAIL reason="exit $status: $(grep -E -m3 'Failure|FAILED|error|Error' <<<"$output" | tr '\n' ' ')"
    fi
    # GoogleTest skips inside a passing program: say which, and why.
    local inner_skips
    inner_skips=$(sed -nE 's/^\[  SKIPPED \] ([0-9]+) tests?, listed below:.*/\1/p' <<<"$output" | tail -1)
    if [ "$verdict" = PASS ] && [ "${inner_skips:-0}" -gt 0 ]; then
      reason=$(grep -Eo -m1 'no usable GPU.{0,80}' <<<"$output" || grep -A1 -m1 'Skipped$' <<<"$output" | tail -1)
      reason="$inner_skips GoogleTest cases skipped: $reason"
    fi
    # On a machine with a GPU nothing may skip for want of one (tests/cuda_kernel_checks.hpp).
    if [ "$gpus" -ge 1 ] && grep -q 'no usable GPU' <<<"$output"; then
      verdict=FAIL reason="says 'no usable GPU' on a machine with $gpus GPU(s): $(grep -m1 'no usable GPU' <<<"$output")"
    fi
    echo "$verdict $name ($seconds s)${reason:+: $reason}" >>"$summary"
    case $verdict in
    PASS) passed=$((passed + 1)) ;;
    SKIP) skipped=$((skipped + 1)) ;;
    FAIL) failed=$((failed + 1)) ;;
    esac
  done <"$b/tests.list"
  echo "# tests: $passed passed, $failed failed, $skipped skipped" >>"$summary"
  cat "$summary"
  [ "$failed" = 0 ]
}

# ---------------------------------------------------------------------------------------------------
# On the build machine: build and pack.

# "soname path" for each library FILE needs (ldd), "soname not-found" for those not found.
needed_libraries() { # FILE
  ldd "$1" 2>/dev/null | awk '$2 == "=>" && $3 == "not" { print $1, "not-found"; next }
                               $2 == "=>" && $3 ~ /^\// { print $1, $3 }'
}

# Copies FILE's libraries (recursively through ldd's closure) into DEST/lib, glibc and CUDA left out,
# the C++ runtime into DEST/lib/fallback. Fails on a library not found or a fabric library.
bundle_libraries_of() { # DEST FILE [fabric-ok]
  local dest=$1 file=$2 soname path
  while read -r soname path; do
    [[ $soname =~ $system_soname_regex ]] && continue
    [[ $soname =~ $cuda_soname_regex ]] && {
      echo "$soname" >>"$dest/.cuda-sonames"
      continue
    }
    [ "$path" = not-found ] && fail "$file needs $soname, which ldd does not find here"
    [[ $soname =~ $fabric_soname_regex ]] && fail "$file needs the fabric library $soname (not bundled)"
    if [[ $soname =~ $fallback_soname_regex ]]; then
      [ -e "$dest/lib/fallback/$soname" ] || cp -L "$path" "$dest/lib/fallback/$soname"
    else
      [ -e "$dest/lib/$soname" ] || cp -L "$path" "$dest/lib/$soname"
    fi
  done < <(needed_libraries "$file")
}

# Whether FILE (an Open MPI or PMIx component) needs a fabric library or one ldd cannot find.
component_unbundlable() { # FILE
  local soname path
  while read -r soname path; do
    [ "$path" = not-found ] && return 0
    [[ $soname =~ $fabric_soname_regex ]] && return 0
  done < <(needed_libraries "$1")
  return 1
}

build_gpu_tree() { # BUILD_DIR
  local build=$1 launcher=()
  if command -v ccache >/dev/null; then
    export CCACHE_BASEDIR=${CCACHE_BASEDIR:-/work} CCACHE_DIR=${CCACHE_DIR:-/work/.ccache}
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache
      -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  if [ ! -f "$build/CMakeCache.txt" ]; then
    local generator=()
    command -v ninja >/dev/null && generator=(-G Ninja)
    cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DZT_WITH_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${ZT_CUDA_ARCH:-90}" "${launcher[@]}"
  fi
  local targets=(zt_gpu_checks) target
  # GPU benchmarks: bench targets named zt_bench_cuda_* or zt_bench_gpu_*.
  while read -r target; do targets+=("$target"); done < <(gpu_bench_targets "$build")
  cmake --build "$build" -j "${ZT_BUILD_JOBS:-$(nproc)}" --target "${targets[@]}"
}

gpu_bench_targets() { # BUILD_DIR
  cmake --build "$1" --target help 2>/dev/null | sed -nE 's/^(\.\.\. )?(zt_bench_(cuda|gpu)[A-Za-z0-9_]*)(:.*)?$/\2/p' |
    sort -u
}

pack() { # BUILD_DIR DEST_DIR ARCHIVE|-
  local build=$1 dest=$2 archive=$3
  local source_dir
  source_dir=$(pwd)
  grep -q '^ZT_WITH_CUDA:STRING=ON' "$build/CMakeCache.txt" ||
    fail "$build is not a CUDA build (ZT_WITH_CUDA=ON); remove it or set ZT_GPU_BUILD_DIR"
  rm -rf "$dest"
  mkdir -p "$dest/bin" "$dest/lib/fallback" "$dest/configs"
  : >"$dest/.cuda-sonames"

  # The tests of label gpu, from ctest's own description, paths rewritten (tests.list, see run_tests).
  local mpiexec
  mpiexec=$(sed -n 's/^MPIEXEC_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")
  ctest --test-dir "$build" --show-only=json-v1 -L '^gpu$' >"$dest/.tests.json" 2>/dev/null ||
    fail "ctest --test-dir $build --show-only=json-v1 failed"
  python3 - "$dest/.tests.json" "$(cd "$build" && pwd)" "$source_dir" "$mpiexec" >"$dest/tests.list" <<'EOF' ||
import json, re, shlex, sys
tests, build, source, mpiexec = json.load(open(sys.argv[1]))["tests"], sys.argv[2], sys.argv[3], sys.argv[4]
def rewrite(arg):
    # mpiexec also inside a wrapper's argument (cmake -DCOMMAND=mpiexec;...); the build tree, the source.
    arg = arg.replace(mpiexec, "@MPIEXEC@") if mpiexec else arg
    return arg.replace(build + "/bin", "@BIN@").replace(source, "@SRC@")
problems = []
# The training comparisons last: the longest, so that the deadline for the tests cuts them, not the
# kernel and NCCL tests (a stable sort keeps ctest's order otherwise).
tests.sort(key=lambda test: test["name"].startswith("mpi.cuda_training"))
for test in tests:
    properties = {p["name"]: p["value"] for p in test.get("properties", [])}
    if not test.get("command"):
        problems.append(test["name"] + " (no built program)")
        continue
    problems += [test["name"] + " (" + name + ")" for name in properties
                 if name in ("WILL_FAIL", "FIXTURES_REQUIRED", "REQUIRED_FILES")]
    ranks = [l[2:] for l in properties.get("LABELS", []) if re.fullmatch(r"np[0-9]+", l)]
    fields = [test["name"], str(int(float(properties.get("TIMEOUT", 1500)))), ranks[0] if ranks else "1",
              "|".join(properties.get("SKIP_REGULAR_EXPRESSION", [])), str(properties.get("SKIP_RETURN_CODE", "")),
              "|".join(properties.get("PASS_REGULAR_EXPRESSION", [])),
              "|".join(properties.get("FAIL_REGULAR_EXPRESSION", []))]
    fields += [rewrite(e) for e in properties.get("ENVIRONMENT", [])] + ["--"] + [rewrite(a) for a in test["command"]]
    print(" ".join(shlex.quote(f) for f in fields))
if problems:
    sys.exit("the bundle's runner cannot run these gpu tests: " + ", ".join(problems))
EOF
    fail "tests.list not written (above)"
  rm "$dest/.tests.json"
  grep -q "$(cd "$build" && pwd)" "$dest/tests.list" &&
    fail "a gpu test names a file of the build tree other than its program: $(grep "$(cd "$build" && pwd)" "$dest/tests.list")"

  # The programs: the tests', the CLI, the GPU benchmarks.
  local programs=() program
  while read -r program; do programs+=("$program"); done < <(grep -o "@BIN@/[A-Za-z0-9_.-]*" "$dest/tests.list" | sort -u | sed 's|@BIN@/||')
  programs+=(zerotrain)
  while read -r program; do programs+=("$program"); done < <(gpu_bench_targets "$build")
  for program in "${programs[@]}"; do
    [ -x "$build/bin/$program" ] || fail "$build/bin/$program is not built (cmake --build $build --target zt_gpu_checks)"
    cp "$build/bin/$program" "$dest/bin/"
  done
  cp examples/configs/*.json "$dest/configs/"
  for program in "$dest"/bin/*; do bundle_libraries_of "$dest" "$program"; done
  # libzerotrain's own libraries (ldd above lists them through it; once more for safety).
  for program in "$dest"/lib/*.so*; do bundle_libraries_of "$dest" "$program"; done

  # Open MPI: mpirun/orted, the components that need no fabric library, help files, mca-params.
  local prefix libdir pkglibdir pkgdatadir sysconfdir
  ompi_path() { ompi_info --path "$1" --parsable | sed -n "s/^path:$1://p"; }
  prefix=$(ompi_path prefix) libdir=$(ompi_path libdir) pkglibdir=$(ompi_path pkglibdir)
  pkgdatadir=$(ompi_path pkgdatadir) sysconfdir=$(ompi_path sysconfdir)
  if [ -z "$prefix" ] || [ ! -d "$pkglibdir" ]; then
    fail "ompi_info does not name Open MPI's directories (is Open MPI installed?)"
  fi
  local ompi=$dest/ompi rel_libdir=${libdir#"$prefix"/} rel_pkglibdir=${pkglibdir#"$prefix"/}
  mkdir -p "$ompi/bin" "$ompi/$rel_pkglibdir" "$ompi/share/openmpi" "$ompi/etc/openmpi"
  local tool
  for tool in orterun orted ompi_info; do
    cp -L "$(dirname "$(command -v ompi_info)")/$tool" "$ompi/bin/$tool"
    bundle_libraries_of "$dest" "$ompi/bin/$tool"
  done
  ln -s orterun "$ompi/bin/mpirun"
  ln -s orterun "$ompi/bin/mpiexec"
  local component dropped=()
  for component in "$pkglibdir"/mca_*.so; do
    # Not MPI's: Java, monitoring and OpenSHMEM's components (atomic, memheap, scoll, spml, sshmem).
    case $(basename "$component") in *_java* | *monitoring* | mca_atomic_* | mca_memheap_* | mca_scoll_* | mca_spml_* | mca_sshmem_*) continue ;; esac
    if component_unbundlable "$component"; then
      dropped+=("$(basename "$component" .so)")
      continue
    fi
    cp -L "$component" "$ompi/$rel_pkglibdir/"
    bundle_libraries_of "$dest" "$component"
  done
  cp "$pkgdatadir"/help-*.txt "$ompi/share/openmpi/"
  [ -d "$pkgdatadir/amca-param-sets" ] && cp -r "$pkgdatadir/amca-param-sets" "$ompi/share/openmpi/"
  cp "$sysconfdir"/openmpi-mca-params.conf "$sysconfdir"/openmpi-default-hostfile "$ompi/etc/openmpi/" 2>/dev/null || true
  # PMIx (external, as Debian builds Open MPI): its components and help files, its layout kept.
  local pmix_library pmix_libdir pmix_prefix="" rel_pmix=""
  pmix_library=$(needed_libraries "$pkglibdir/mca_pmix_ext3x.so" 2>/dev/null | awk '$1 ~ /^libpmix\.so/ { print $2 }')
  if [ -n "$pmix_library" ]; then
    pmix_libdir=$(dirname "$(realpath "$pmix_library")")
    pmix_prefix=$(dirname "$pmix_libdir")
    rel_pmix=${pmix_prefix#/}
    mkdir -p "$ompi/$rel_pmix/lib/pmix" "$ompi/$rel_pmix/share"
    for component in "$pmix_libdir"/pmix/*.so; do
      [ -e "$component" ] || continue
      if component_unbundlable "$component"; then
        dropped+=("$(basename "$component" .so)")
        continue
      fi
      cp -L "$component" "$ompi/$rel_pmix/lib/pmix/"
      bundle_libraries_of "$dest" "$component"
    done
    [ -d "$pmix_prefix/share/pmix" ] && cp -r "$pmix_prefix/share/pmix" "$ompi/$rel_pmix/share/"
    cp "$pmix_prefix"/share/pmix-mca-params.conf "$ompi/$rel_pmix/share/" 2>/dev/null || true
  fi
  # Every library a bundled library needs, to the closure's end.
  local count=0 before
  while :; do
    before=$(find "$dest/lib" -type f | wc -l)
    for program in "$dest"/lib/*.so* "$dest"/lib/fallback/*.so*; do bundle_libraries_of "$dest" "$program"; done
    [ "$(find "$dest/lib" -type f | wc -l)" = "$before" ] && break
    count=$((count + 1))
    [ "$count" -lt 20 ] || fail "the library closure does not end"
  done

  cp "$script_path" "$dest/gpu-bundle.sh"
  chmod +x "$dest/gpu-bundle.sh"
  local glibc
  glibc=$(find "$dest" -type f \( -name '*.so*' -o -perm -u+x \) -exec objdump -T {} + 2>/dev/null |
    grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1 || true)
  {
    echo "created=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo +changes)"
    # shellcheck disable=SC1091  # the build machine's
    echo "build_host=$(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(getconf GNU_LIBC_VERSION | cut -d' ' -f2)"
    echo "glibc_needed=${glibc#GLIBC_}"
    echo "cuda_architectures=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt")"
    echo "cuda_sonames=$(sort -u "$dest/.cuda-sonames" | tr '\n' ' ')"
    echo "ompi_libdir=$rel_libdir"
    echo "ompi_pkglibdir=$rel_pkglibdir"
    echo "pmix_prefix=$rel_pmix"
    echo "ompi_components_left_out=${dropped[*]}"
    echo "programs=$(cd "$dest/bin" && echo *)"
  } >"$dest/MANIFEST"
  rm "$dest/.cuda-sonames"
  note "bundle staged in $dest: $(du -sh "$dest" | cut -f1); CUDA sonames expected from the image: $(sed -n 's/^cuda_sonames=//p' "$dest/MANIFEST")"
  [ "$archive" = - ] && return
  mkdir -p "$(dirname "$archive")"
  tar -C "$(dirname "$dest")" -cf - "$(basename "$dest")" | xz -T0 -7 >"$archive.tmp"
  mv "$archive.tmp" "$archive"
  local mib
  mib=$(($(stat -c %s "$archive") / 1048576))
  [ "$mib" -lt "$max_archive_mib" ] || fail "$archive is $mib MiB, over the $max_archive_mib MiB the device tool carries with the tree"
  note "wrote $archive ($(du -h "$archive" | cut -f1)); carry .gpu-bundle (docs/gpu.md)"
}

# ---------------------------------------------------------------------------------------------------
# --check: an existing bundle, here, without a GPU.

check_bundle() { # ARCHIVE
  local archive=$1
  [ -f "$archive" ] || fail "no bundle at $archive (scripts/gpu-bundle.sh packs one)"
  local mib
  mib=$(($(stat -c %s "$archive") / 1048576))
  [ "$mib" -lt "$max_archive_mib" ] || fail "$archive is $mib MiB (limit $max_archive_mib)"
  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/zt-gpu-bundle-check.XXXXXX")
  # shellcheck disable=SC2064  # expand now: the directory to remove
  trap "rm -rf '$work'" EXIT
  tar -C "$work" -xJf "$archive"
  local b=$work/$bundle_name
  [ -f "$b/MANIFEST" ] || fail "$archive holds no $bundle_name/MANIFEST"
  note "unpacked $archive ($mib MiB) into $b"
  sed 's/^/  /' "$b/MANIFEST"
  # The CUDA libraries of the toolkit stand in for the image's pip packages.
  local cuda_standin=${ZT_CUDA_LIBRARY_DIRS:-/usr/local/cuda/lib64:/usr/local/cuda/lib}
  local problems=0 file soname path
  while IFS= read -r file; do
    file -b "$file" | grep -q '^ELF' || continue
    while read -r soname path; do
      if [ "$path" = not-found ]; then
        echo "  not found: $soname (needed by ${file#"$b"/})"
        problems=$((problems + 1))
      elif [[ $path == "$b"/* ]]; then
        :
      elif [[ $soname =~ $system_soname_regex ]] || [[ $soname =~ $fallback_soname_regex ]]; then
        :
      elif [[ $soname =~ $cuda_soname_regex ]] && [[ :$cuda_standin: == *:"$(dirname "$path")":* ]]; then
        [[ $soname =~ ^libcuda\.so ]] && {
          echo "  ${file#"$b"/} links libcuda (the driver): binaries must load without a GPU"
          problems=$((problems + 1))
        }
      else
        echo "  outside the bundle: $soname => $path (needed by ${file#"$b"/})"
        problems=$((problems + 1))
      fi
    done < <(LD_LIBRARY_PATH="$b/lib:$cuda_standin" needed_libraries "$file")
  done < <(find "$b/bin" "$b/lib" "$b/ompi" -type f)
  [ "$problems" = 0 ] || fail "$problems libraries do not resolve inside the bundle (or the CUDA stand-in)"
  note "ldd: every binary and library resolves inside the bundle, CUDA from $cuda_standin"

  # Open MPI relocated: the host's Open MPI and PMIx directories hidden (a private mount namespace),
  # so that only the bundle's components, help files and parameters can be found.
  local hide=() dir
  for dir in "$(ompi_info --path pkglibdir --parsable 2>/dev/null | sed -n 's/^path:pkglibdir://p')" \
    /etc/openmpi /usr/share/openmpi /usr/lib/x86_64-linux-gnu/pmix2; do
    [ -n "$dir" ] && [ -d "$dir" ] && hide+=("$dir")
  done
  local isolate=()
  if unshare -m true 2>/dev/null; then
    # shellcheck disable=SC2016  # the helper's own variables
    printf '%s\n' '#!/usr/bin/env bash' 'set -e' 'while [ "$1" != -- ]; do mount -t tmpfs none "$1"; shift; done' \
      'shift' 'exec "$@"' >"$work/isolate.sh"
    chmod +x "$work/isolate.sh"
    isolate=(unshare -m "$work/isolate.sh" "${hide[@]}" --)
    note "hiding the host's ${hide[*]} in a private mount namespace"
  else
    note "cannot unshare a mount namespace: the host's Open MPI directories stay visible (ompi_info shows which are used)"
  fi
  local in_bundle=(env -u OPAL_PREFIX ZT_CUDA_LIBRARY_DIRS="$cuda_standin" "${isolate[@]}" "$b/gpu-bundle.sh")
  local paths
  paths=$("${in_bundle[@]}" exec ompi_info --path all --parsable) || fail "the bundle's ompi_info failed: $paths"
  if grep -E '^path:(prefix|libdir|pkglibdir|pkgdatadir|sysconfdir):' <<<"$paths" | grep -v ":$b/ompi"; then
    fail "the bundle's Open MPI uses directories outside the bundle (above)"
  fi
  local components
  components=$("${in_bundle[@]}" exec ompi_info --parsable | grep -c '^mca:.*:version:"mca:' || true)
  [ "$components" -gt 50 ] || fail "the bundle's ompi_info finds only $components components"
  note "ompi_info relocated: prefix, libdir, pkglibdir, pkgdatadir and sysconfdir in the bundle; $components components"
  local output
  output=$("${in_bundle[@]}" exec mpirun -n 2 --oversubscribe zerotrain train --config "$b/configs/mlp-zero0.json" \
    --steps 3 --print-every 1 2>&1) || fail "mpirun -n 2 zerotrain train (relocated) failed: $output"
  grep -q 'step *3/3' <<<"$output" || fail "mpirun -n 2 zerotrain train: no 'step 3/3' line: $output"
  note "mpirun -n 2 zerotrain train --config mlp-zero0.json --steps 3: $(grep -E 'step *3/3' <<<"$output" | head -1)"
  output=$("${in_bundle[@]}" exec zerotrain report 2>&1) || fail "zerotrain report (singleton MPI_Init, relocated) failed: $output"
  note "zerotrain report without mpirun (singleton MPI_Init): $(grep -E -m1 '^ *ranks:' <<<"$output" | tr -s ' ')"

  # The runner, without a GPU: every test skipped, none saying anything but "no usable GPU".
  local summary=$work/summary.txt status=0
  ZT_GPU_COUNT=0 ZT_SOURCE_DIR="$(pwd)" "${in_bundle[@]}" tests "$summary" "$work/tests.log" >/dev/null || status=$?
  sed 's/^/  /' "$summary"
  [ "$status" = 0 ] || { sed 's/^/    /' "$work/tests.log" | tail -40; fail "the test runner exited $status without a GPU"; }
  local listed reported
  listed=$(grep -c . "$b/tests.list")
  reported=$(grep -Ec '^SKIP .*no usable GPU|^PASS .*GoogleTest cases skipped: no usable GPU' "$summary" || true)
  [ "$reported" = "$listed" ] ||
    fail "$listed gpu tests listed, $reported reported skipped for want of a GPU (summary above)"
  note "the runner: all $listed gpu tests skipped 'no usable GPU' (or passed with their CUDA cases skipped so), exit 0"
  echo "PASS: check"
}

# ---------------------------------------------------------------------------------------------------
main() {
script_path=$(realpath "$0")
mode=${1:-pack}
case $mode in
exec)
  shift
  [ $# -gt 0 ] || fail "usage: BUNDLE/gpu-bundle.sh exec CMD..."
  bundle_exec "$(bundle_root)" "$@"
  ;;
cuda-dirs)
  cuda_library_dirs
  ;;
tests)
  [ $# -ge 2 ] || fail "usage: BUNDLE/gpu-bundle.sh tests SUMMARY [LOG]"
  run_tests "$(bundle_root)" "$2" "${3:-$2.log}"
  ;;
pack | stage)
  cd "$(dirname "$0")/.."
  build=${ZT_GPU_BUILD_DIR:-build-gpu}
  for tool in cmake python3 ompi_info ldd objdump xz; do
    command -v "$tool" >/dev/null || fail "$tool is needed to pack the bundle"
  done
  [ "${ZT_GPU_BUNDLE_NO_BUILD:-0}" = 1 ] || build_gpu_tree "$build"
  if [ "$mode" = stage ]; then
    [ $# -ge 2 ] || fail "usage: scripts/gpu-bundle.sh stage DIR"
    pack "$build" "$2/$bundle_name" -
  else
    out=${ZT_GPU_BUNDLE_DIR:-.gpu-bundle}
    pack "$build" "$build/$bundle_name" "$out/$bundle_name.tar.xz"
  fi
  ;;
--check)
  cd "$(dirname "$0")/.."
  check_bundle "${2:-.gpu-bundle/$bundle_name.tar.xz}"
  ;;
*)
  sed -n '2,/^set -euo/p' "$0" | sed '$d'
  exit 2
  ;;
esac
}
# One line: bash has read all of main before it runs, so editing this file during a pack is safe.
main "$@"; exit $?
