// The HTML report of `deltafin bench --report` (see bench_report.cpp).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace deltafin::cli {

// A self-contained HTML page (inline SVG, no script) from the object `bench --json` prints.
std::string bench_report_html(const nlohmann::json& bench);

}  // namespace deltafin::cli
