# Spack recipe for zerotrain (docs/spack.md). Package API v2 (Spack v1.0 and later).
#
# Where the source comes from: zerotrain has no public home yet. Whoever publishes it sets
# `homepage`, `url` (the release tarball: the file `Spack/checksum-release.sh vX.Y.Z` makes, uploaded
# as is) and `git` below, and adds each release's `version(...)` line that the script prints. Until
# then the recipe builds from a local checkout: `spack develop` or the environments Spack/spack.yaml
# (CPU) and Spack/cuda/spack.yaml (CUDA clusters).
#
# tests/spack/check_recipe.py (ctest spack.recipe) keeps this file and the CMake code in step: every
# depends_on is something the CMake code finds, every CMake option has a variant or is listed there
# with the reason it is not one, and every define below names a variable the CMake code reads.

from spack_repo.builtin.build_systems.cmake import CMakePackage
from spack_repo.builtin.build_systems.cuda import CudaPackage

from spack.package import *


class Zerotrain(CMakePackage, CudaPackage):
    """ZeRO training (DeepSpeed's ideas: ZeRO stages 0-3, offload, pipeline parallelism) as a C++
    library with C and Fortran interfaces and a command-line trainer, under MPI."""

    # homepage = "https://<where zerotrain is published>/"
    # url = "https://<where zerotrain is published>/releases/zerotrain-0.1.0.tar.gz"
    # git = "https://<where zerotrain is published>/zerotrain.git"

    maintainers("zerotrain")
    license("Apache-2.0")

    # A development line: built from a checkout with `spack develop` (needs `git` above to fetch).
    version("main", branch="main")
    # Releases: one line per tag, printed by `Spack/checksum-release.sh v0.1.0` (docs/spack.md), e.g.
    # version("0.1.0", sha256="<sha256 of zerotrain-0.1.0.tar.gz>")

    # No nccl variant (the CUDA build always uses NCCL: a dependency of +cuda), no cudnn (unused),
    # no kokkos (the CMake code has no such option), no shared (the library is shared only: the C
    # API's symbol versions and the Fortran module rely on it). docs/spack.md, "The recipe".
    variant("uring", default=True, description="io_uring (liburing) for NVMe offload I/O")
    variant("fortran", default=False, description="Build the Fortran module (mpi_f08 based)")
    variant(
        "onednn",
        default=False,
        description="bf16 host GEMMs through oneDNN on CPUs with AVX512-BF16/AMX-BF16 (else they widen to fp32)",
    )
    variant("tests", default=False, description="Build the test suite (run with spack install --test=root)")
    variant("benchmarks", default=False, description="Build and install the benchmarks")

    # zerotrain's own C++ is C++20; C for the C API, its examples and CMake's checks.
    depends_on("c", type="build")
    depends_on("cxx", type="build")
    depends_on("fortran", type="build", when="+fortran")

    depends_on("cmake@3.24:", type="build")
    depends_on("pkgconfig", type="build")

    depends_on("mpi@3:")
    depends_on("hdf5@1.10:+mpi")
    depends_on("nlohmann-json@3.10:")
    # Any BLAS with the CBLAS interface; OpenBLAS is the one the tests run with.
    depends_on("blas")
    depends_on("libaio")
    depends_on("liburing", when="+uring")
    # oneDNN threads with OpenMP, as the host kernels do (cmake/ZerotrainOneDnn.cmake refuses TBB).
    depends_on("onednn@2.6: cpu_runtime=omp", when="+onednn")
    depends_on("googletest", when="+tests")
    # tests/cuda_on_host translates the CUDA sources with a Python script (tests of a CUDA build).
    depends_on("python@3:", type="build", when="+tests+cuda")

    # CUDA: kernels in C++20 (nvcc 12 and later) and NCCL built for the same GPU architectures.
    depends_on("cuda@12:", when="+cuda")
    depends_on("nccl", when="+cuda")
    for _arch in CudaPackage.cuda_arch_values:
        depends_on(f"nccl cuda_arch={_arch}", when=f"+cuda cuda_arch={_arch}")

    requires("platform=linux", msg="zerotrain's offload I/O uses libaio and io_uring, Linux interfaces")
    # C++20 with its library (std::bit_cast, std::span): GCC 11 is the first GCC with both.
    conflicts("%gcc@:10", msg="zerotrain is C++20 (std::bit_cast): GCC 11 or newer")
    conflicts("cuda_arch=none", when="+cuda", msg="+cuda needs cuda_arch=<GPU architecture>, e.g. 90")
    # The Fortran module uses MPI's mpi_f08 module.
    conflicts("^openmpi~fortran", when="+fortran", msg="+fortran needs an MPI with Fortran bindings")
    conflicts("^mpich~fortran", when="+fortran", msg="+fortran needs an MPI with Fortran bindings")

    # FindBLAS's name (BLA_VENDOR) for each provider of Spack's `blas` virtual that zerotrain's CMake
    # code is told to pick; any other provider is searched for by all names (BLA_VENDOR=All).
    blas_vendors = {
        "openblas": "OpenBLAS",
        "intel-oneapi-mkl": "Intel10_64lp_seq",
        "blis": "FLAME",
        "amdblis": "FLAME",
        "flexiblas": "FlexiBLAS",
        "netlib-lapack": "Generic",
        "armpl-gcc": "Arm",
        "acfl": "Arm",
        "atlas": "ATLAS",
        "fujitsu-ssl2": "Fujitsu_SSL2",
    }

    def cmake_args(self):
        spec = self.spec

        def on_off(variant):
            return "ON" if spec.satisfies(f"+{variant}") else "OFF"

        args = [
            # AUTO/ON/OFF switches in CMake: ON makes a missing dependency an error.
            self.define("ZT_WITH_CUDA", on_off("cuda")),
            self.define("ZT_WITH_URING", on_off("uring")),
            self.define("ZT_WITH_FORTRAN", on_off("fortran")),
            self.define("ZT_WITH_ONEDNN", on_off("onednn")),
            self.define_from_variant("ZT_BUILD_TESTS", "tests"),
            self.define_from_variant("ZT_BUILD_BENCH", "benchmarks"),
            self.define("BLA_VENDOR", self.blas_vendors.get(spec["blas"].name, "All")),
            self.define("MPI_C_COMPILER", spec["mpi"].mpicc),
            # Spack's prefixes are outside the system's library directories: zerotrain.pc links
            # with an rpath, so that programs built with pkg-config run without LD_LIBRARY_PATH.
            self.define("ZT_PKG_CONFIG_RPATH", True),
        ]
        if spec.satisfies("+fortran"):
            args.append(self.define("MPI_Fortran_COMPILER", spec["mpi"].mpifc))
        if spec.satisfies("+cuda"):
            args.extend(
                [
                    self.define("CUDAToolkit_ROOT", spec["cuda"].prefix),
                    self.define("CMAKE_CUDA_COMPILER", spec["cuda"].prefix.bin.nvcc),
                    self.define("CMAKE_CUDA_ARCHITECTURES", spec.variants["cuda_arch"].value),
                    self.define("ZT_NCCL_LIBRARY", spec["nccl"].libs[0]),
                    self.define("ZT_NCCL_INCLUDE_DIR", spec["nccl"].prefix.include),
                ]
            )
        return args
