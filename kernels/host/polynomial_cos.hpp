// fill_normal's cosine without libm (kernels/host/elementwise.cpp): a polynomial whose results stand in
// for libm's cos wherever an error bound shows they give the same converted value.
#pragma once

#include <cmath>

namespace zt::kernels::host {

/// cos(x) for x in [0, 2 pi] without libm: Cody-Waite reduction by pi/2 (fdlibm's two-part pi/2; n <= 4
/// keeps n * kPio2High exact), then fdlibm's __kernel_sin/__kernel_cos polynomials on |y| <= pi/4.
/// Absolute error a few 1e-16, far inside kFastCosError (unit.nn checks 2^-46 against libm
/// over 2^22 arguments). Branch-free, so that the span loop vectorizes.
[[gnu::always_inline]] inline double polynomial_cos(double x) {
  constexpr double kTwoOverPi = 6.36619772367581382433e-01;
  constexpr double kPio2High = 1.57079632673412561417e+00;  // the first 33 bits of pi/2
  constexpr double kPio2Low = 6.07710050650619224932e-11;   // pi/2 - kPio2High
  const double n = std::nearbyint(x * kTwoOverPi);
  const double y = (x - n * kPio2High) - n * kPio2Low;
  const double z = y * y;
  const double cos_y =
      1.0 - 0.5 * z +
      z * z *
          (4.16666666666666019037e-02 +
           z * (-1.38888888888741095749e-03 +
                z * (2.48015872894767294178e-05 +
                     z * (-2.75573143513906633035e-07 +
                          z * (2.08757232129817482790e-09 + z * -1.13596475577881948265e-11)))));
  const double sin_y =
      y + y * z *
              (-1.66666666666666324348e-01 +
               z * (8.33333333332248946124e-03 +
                    z * (-1.98412698298579493134e-04 +
                         z * (2.75573137070700676789e-06 +
                              z * (-2.50507602534068634195e-08 + z * 1.58969099521155010221e-10)))));
  const int quadrant = static_cast<int>(n) & 3;  // cos(y + n pi/2) = cos y, -sin y, -cos y, sin y
  const double value = (quadrant & 1) != 0 ? sin_y : cos_y;
  return (quadrant == 1 || quadrant == 2) ? -value : value;
}

/// What polynomial_cos may differ from libm's cos by, with a wide margin (both are within ~1e-16 of
/// the exact cosine).
inline constexpr double kFastCosError = 0x1p-40;

}  // namespace zt::kernels::host
