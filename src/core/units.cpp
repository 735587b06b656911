// Byte counts as text (see units.h).
#include "core/units.h"

#include <fmt/format.h>

namespace deltafin {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  return fmt::format("{:.{}f} {}", b, u == 0 ? 0 : 2, units[u]);
}

std::string disk_bytes(double b) {
  if (b >= 1e12) return fmt::format("{:.2f} TB", b / 1e12);
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  return fmt::format("{:.0f} kB", b / 1e3);
}

}  // namespace deltafin
