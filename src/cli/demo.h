// The built-in demo model (a tiny trained K3 embedded in the binary; see demo.cpp).
#pragma once

#include <string>

namespace deltafin::cli {

// Unpacks the embedded demo checkpoint into <cache>/demo-k3-english unless it is already there
// (same archive), prints the notice that says what it is, and returns the folder.
std::string install_demo_model();

// When `model_dir` is the installed demo and `draft` is its own draft/ folder: the notice that
// says the demo drafts with it (and how to turn that off); otherwise empty. The demo's notice
// from install_demo_model does not mention drafting, so --draft none or ngram never reads as if
// the demo's drafter were in use.
std::string demo_drafter_note(const std::string& model_dir, const std::string& draft);

}  // namespace deltafin::cli
