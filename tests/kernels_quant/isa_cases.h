// Shared by the quantized-linear tests: the ISA levels a QuantizedLinear is checked on (the scalar
// reference, the scalar path of the packed kernels, AVX2, AVX-512 where the CPU has them) and a
// guard that restores the ISA cap and the reference switch whatever a test does.
#pragma once
#include <array>

#include "core/cpu_features.h"
#include "quant/quant.h"

namespace perry::testing {

struct IsaGuard {
  IsaLevel saved = perry::max_isa();
  ~IsaGuard() {
    perry::set_max_isa(saved);
    quant::set_quant_force_reference(false);
  }
};

struct IsaCase {
  const char* name;
  IsaLevel level;
  bool reference;  // quant::set_quant_force_reference(true): the scalar reference kernels
  bool available;
};

inline std::array<IsaCase, 4> quant_isa_cases() {
  const auto& f = perry::cpu_features();
  return {{{"reference", IsaLevel::Scalar, true, true},
           {"scalar-isa", IsaLevel::Scalar, false, true},
           {"avx2", IsaLevel::Avx2, false, f.avx2 && f.fma},
           {"avx512", IsaLevel::Avx512, false, f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512_vnni}}};
}

// Caps the ISA (and sets the reference switch) as `isa` says; false if the CPU lacks it.
inline bool select_isa(const IsaCase& isa) {
  if (!isa.available) return false;
  perry::set_max_isa(isa.level);
  quant::set_quant_force_reference(isa.reference);
  return true;
}

}  // namespace perry::testing
