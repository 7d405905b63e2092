// How the host's bf16 GEMMs run, chosen at run time (docs/architecture.md, "Host bf16 GEMMs").
//
//   bf16  oneDNN matmul primitives on the bf16 operands: bf16 products accumulated in fp32, the
//         result rounded to bf16 once (alpha and beta applied in fp32 before that rounding). Native
//         on CPUs with AVX512-BF16 or AMX-BF16 dot products; needs a build with oneDNN (ZT_WITH_ONEDNN).
//   fp32  the widening path: fp32 copies of the operands (and of C when beta != 0), sgemm, then one
//         rounding per element. The same contract, in another summation order.
// By default (ZT_BF16_GEMM unset, empty or "auto") bf16 where both the CPU and the build have it, fp32
// elsewhere; ZT_BF16_GEMM=bf16|fp32 forces one (an unknown name, or bf16 in a build without oneDNN or
// on a CPU where oneDNN has no bf16 matmul, is an error at the first bf16 GEMM). fp16 and fp32 GEMMs
// are not affected.
//
// Numerics: both paths accumulate in fp32 and round once, so they agree within bf16 rounding (a few
// bf16 ulps relative to the sum of |a||b|), not bitwise. Each path is deterministic run to run on a
// given machine and thread count; ranks that pick different paths (a mixed cluster, or ZT_BF16_GEMM set
// differently) compute different last bits, as with ZT_HOST_ISA (kernels/host_isa.hpp).
#pragma once

#include <string>

namespace zt::kernels {

enum class Bf16GemmPath { fp32 = 0, bf16 = 1 };

/// "fp32" or "bf16".
const char* bf16_gemm_path_name(Bf16GemmPath path);
/// Whether this build has the native bf16 GEMM (linked with oneDNN).
bool bf16_gemm_compiled();
/// Whether this CPU has native bf16 dot products (AVX512-BF16 or AMX-BF16) that oneDNN will use
/// (ONEDNN_MAX_CPU_ISA can forbid them); false in a build without oneDNN.
bool cpu_has_native_bf16_gemm();
/// Whether the bf16 path can run here at all: built with oneDNN, and oneDNN builds a bf16 matmul on
/// this CPU (natively with AVX512-BF16 or AMX-BF16, emulated on plain AVX-512; the oneDNN of Debian 12
/// has none for CPUs without AVX-512). Probed once.
bool bf16_gemm_runnable();
/// The path bf16 GEMMs take now. On the first call: ZT_BF16_GEMM if set (and not "auto"), else bf16
/// when bf16_gemm_compiled() and cpu_has_native_bf16_gemm(), fp32 otherwise; throws if ZT_BF16_GEMM is
/// invalid or asks for bf16 where it cannot run (bf16_gemm_runnable()).
Bf16GemmPath bf16_gemm_path();
/// Switch every later bf16 GEMM (all threads) to `path`: for tests and benchmarks that compare the paths
/// in one process. Throws for bf16 where it cannot run (bf16_gemm_runnable()).
void set_bf16_gemm_path(Bf16GemmPath path);
/// One line for `zerotrain report`: the path in use and why; an invalid ZT_BF16_GEMM gives its error.
std::string bf16_gemm_description();

}  // namespace zt::kernels
