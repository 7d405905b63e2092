// The instruction set the host kernels run with, chosen at run time.
//
// The library is built for the baseline ISA of its target (x86-64: SSE2), so that one binary runs on
// every machine a Spack or Debian build lands on. The hot host loops (optimizer updates, the 16-bit
// parameter cast, the gradient sum of squares, layer norm, GELU, the softmax exps of attention and
// cross-entropy) are compiled once more per x86 ISA level from the same source
// (kernels/host/host_isa_kernels.hpp) and picked through a table at each call:
//   avx512    AVX-512 F/BW/VL/DQ (+ everything of avx2), 512-bit vectors
//   avx2      AVX2 + FMA + F16C (x86-64-v3)
//   baseline  the build's own ISA
// By default the best path this CPU supports; ZT_HOST_ISA=avx512|avx2|baseline|auto forces one (an
// unknown name, or a path this CPU cannot run, is an error at the first host kernel call).
//
// Numerics: the kernels are compiled with -ffp-contract=off, so no path fuses a multiply-add and every
// element-wise result (AdamW, SGD, casts, GELU, layer norm, the softmax exps) has the same bits on every
// path. The one exception is cross-entropy's row sum of exps, a SIMD sum whose order follows the vector
// width: its last bits depend on the path, never on the thread count. A binary on a given machine is
// deterministic; ranks on a mixed cluster (some nodes with AVX-512, some without) pick different paths
// unless ZT_HOST_ISA is set to the same value everywhere (docs/architecture.md).
#pragma once

#include <string>
#include <string_view>

namespace zt::kernels {

enum class HostIsa { baseline = 0, avx2 = 1, avx512 = 2 };
inline constexpr int kHostIsaCount = 3;

/// "baseline", "avx2" or "avx512".
const char* host_isa_name(HostIsa isa);
/// The path named by `text` ("baseline", "avx2", "avx512"); throws naming `what` (e.g. "ZT_HOST_ISA")
/// and the accepted names otherwise. "auto" is not a path: callers handle it first.
HostIsa parse_host_isa(std::string_view text, std::string_view what);
/// Whether this CPU (and this build: non-x86 or non-GCC builds have baseline only) can run `isa`.
bool host_isa_supported(HostIsa isa);
/// The best path this CPU supports.
HostIsa best_host_isa();
/// The paths this CPU supports, best first, e.g. "avx512, avx2, baseline".
std::string supported_host_isas();

/// The path the host kernels use now. On the first call: ZT_HOST_ISA if set (and not "auto"), else
/// best_host_isa(); throws if ZT_HOST_ISA is invalid or names a path this CPU cannot run.
HostIsa host_isa();
/// Switch every later host kernel call (all threads) to `isa`: for tests and benchmarks that run the
/// paths side by side. Throws if this CPU cannot run it.
void set_host_isa(HostIsa isa);
/// One line for `zerotrain report`: the path in use and why (auto or forced by ZT_HOST_ISA); an invalid
/// ZT_HOST_ISA gives its error text instead of throwing.
std::string host_isa_description();

}  // namespace zt::kernels
