// AVX2 + FMA kernels (x86-64). Compiled with -mavx2 -mfma -mf16c for this file only.
// Until the tuned kernels land, this table reuses the scalar reference entries.
#include "core/sysinfo.h"
#include "kernels/kernels.h"

namespace deltafin::kernels {

const KernelTable* avx2_table() {
  if (!cpu_features().avx2 || !cpu_features().fma) return nullptr;
  static const KernelTable t = [] {
    KernelTable k = scalar_table();
    k.name = "avx2";
    return k;
  }();
  return &t;
}

const KernelTable* avx512_table() { return nullptr; }

}  // namespace deltafin::kernels
