// CPU features, read once from CPUID (and XGETBV for OS support of the wide registers).
#pragma once
#include <string>

namespace perry {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_vnni = false, avx512_bf16 = false, avx_vnni = false;
  std::string brand;
  int cores = 1;  // threads the pool uses by default (hardware concurrency)
};

const CpuFeatures& cpu_features();

// Kernel-family predicates used by dispatch (checked in priority order).
bool supports_avx2();
bool supports_avx512();        // F + BW + VL + DQ
bool supports_avx512_vnni();   // avx512() + VNNI
bool supports_avx512_bf16();   // avx512() + BF16

// PERRY_FORCE_ISA=scalar|avx2|avx512 caps the ISA used (tests compare paths with it).
enum class IsaLevel { Scalar, Avx2, Avx512 };
IsaLevel max_isa();
void set_max_isa(IsaLevel level);

}  // namespace perry
