// Byte counts as people read them: memory in binary units ("1.50 GiB", as RAM and budgets are
// sized) and disks and downloads in decimal units ("1.56 TB", as drives are sold).
#pragma once

#include <string>

namespace deltafin {

std::string human_bytes(double bytes);
// Decimal units: "1.56 TB", "12.35 GB", "3.2 MB", "740 kB".
std::string disk_bytes(double bytes);

}  // namespace deltafin
