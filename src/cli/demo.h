// The built-in demo model (a tiny trained K3 embedded in the binary; see demo.cpp).
#pragma once

#include <string>

namespace deltafin::cli {

// Unpacks the embedded demo checkpoint into <cache>/demo-k3-english unless it is already there
// (same archive), prints the notice that says what it is, and returns the folder.
std::string install_demo_model();

}  // namespace deltafin::cli
