#include "core/cpu_features.h"

#include <cpuid.h>

#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>

namespace perry {
namespace {

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  bool osxsave = c & (1u << 27);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  bool ymm_ok = (xcr0 & 0x6) == 0x6, zmm_ok = (xcr0 & 0xe6) == 0xe6;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = ymm_ok && (b & (1u << 5));
    f.avx512f = zmm_ok && (b & (1u << 16));
    f.avx512dq = zmm_ok && (b & (1u << 17));
    f.avx512bw = zmm_ok && (b & (1u << 30));
    f.avx512vl = zmm_ok && (b & (1u << 31));
    f.avx512_vnni = zmm_ok && (c & (1u << 11));
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
    f.avx_vnni = ymm_ok && (a & (1u << 4));
    f.avx512_bf16 = zmm_ok && (a & (1u << 5));
  }
  char brand[49] = {};
  if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004) {
    for (unsigned i = 0; i < 3; ++i)
      __get_cpuid(0x80000002 + i, reinterpret_cast<unsigned*>(brand + 16 * i),
                  reinterpret_cast<unsigned*>(brand + 16 * i + 4),
                  reinterpret_cast<unsigned*>(brand + 16 * i + 8),
                  reinterpret_cast<unsigned*>(brand + 16 * i + 12));
  }
  f.brand = brand;
  while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
  f.cores = std::max(1u, std::thread::hardware_concurrency());
  return f;
}

IsaLevel initial_isa() {
  const char* e = std::getenv("PERRY_FORCE_ISA");
  if (e) {
    std::string_view s(e);
    if (s == "scalar") return IsaLevel::Scalar;
    if (s == "avx2") return IsaLevel::Avx2;
  }
  return IsaLevel::Avx512;
}

IsaLevel g_max_isa = initial_isa();

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

IsaLevel max_isa() { return g_max_isa; }
void set_max_isa(IsaLevel level) { g_max_isa = level; }

bool supports_avx2() {
  const auto& f = cpu_features();
  return max_isa() >= IsaLevel::Avx2 && f.avx2 && f.fma && f.f16c;
}
bool supports_avx512() {
  const auto& f = cpu_features();
  return max_isa() >= IsaLevel::Avx512 && supports_avx2() && f.avx512f && f.avx512bw &&
         f.avx512vl && f.avx512dq;
}
bool supports_avx512_vnni() { return supports_avx512() && cpu_features().avx512_vnni; }
bool supports_avx512_bf16() { return supports_avx512() && cpu_features().avx512_bf16; }

}  // namespace perry
