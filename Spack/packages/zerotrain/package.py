# Spack recipe for zerotrain. Use it from this repository as a Spack package repo:
#   spack repo add <zerotrain>/Spack
#   spack install zerotrain +cuda cuda_arch=90
from spack.package import *


class Zerotrain(CMakePackage, CudaPackage):
    """ZeRO training (DeepSpeed's ideas) for C++, C and Fortran codes under MPI."""

    homepage = "https://zerotrain.example/"
    git = "https://zerotrain.example/zerotrain.git"

    maintainers("zerotrain")
    license("Apache-2.0")

    version("main", branch="main")

    variant("uring", default=True, description="io_uring (liburing) for NVMe offload I/O")
    variant("tests", default=False, description="Build the test suite")
    variant("benchmarks", default=False, description="Build the benchmarks")

    depends_on("cmake@3.24:", type="build")
    depends_on("pkgconfig", type="build")  # the build finds libaio and liburing with it
    depends_on("mpi")
    depends_on("hdf5+mpi")
    depends_on("nlohmann-json@3.10:")
    depends_on("openblas")
    depends_on("libaio")
    depends_on("liburing", when="+uring")
    depends_on("googletest", when="+tests")
    depends_on("nccl", when="+cuda")
    for arch in CudaPackage.cuda_arch_values:
        depends_on(f"nccl cuda_arch={arch}", when=f"+cuda cuda_arch={arch}")

    def cmake_args(self):
        args = [
            self.define("ZT_WITH_CUDA", "ON" if self.spec.satisfies("+cuda") else "OFF"),
            self.define("ZT_WITH_URING", "ON" if self.spec.satisfies("+uring") else "OFF"),
            self.define_from_variant("ZT_BUILD_TESTS", "tests"),
            self.define_from_variant("ZT_BUILD_BENCH", "benchmarks"),
        ]
        if self.spec.satisfies("+cuda"):
            archs = self.spec.variants["cuda_arch"].value
            if archs and archs[0] != "none":
                args.append(self.define("CMAKE_CUDA_ARCHITECTURES", ";".join(archs)))
            args.append(self.define("NCCL_HOME", self.spec["nccl"].prefix))
        return args
