// `deltafin bench --report FILE.html`: the bench figures as one self-contained HTML file with
// inline SVG charts — something a user can attach to an issue and anyone can open offline. The
// charts are drawn here (a few rectangles and lines) rather than by a plotting library: the
// figures are few, the file must carry no script, and the project copies no third-party code.
// Input is the same JSON object `bench --json` prints, so the report and the JSON never differ.
#include "cli/bench_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

namespace deltafin::cli {

namespace {

using json = nlohmann::json;

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '&':
        o += "&amp;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

double num(const json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}

struct Bar {
  std::string label;
  double value;
  const char* color;
};

// Horizontal bars with their values written next to them.
std::string bar_chart(const std::string& title, const std::vector<Bar>& bars,
                      const std::string& unit, int digits) {
  const int W = 640, row = 28, left = 190, H = static_cast<int>(bars.size()) * row + 36;
  double max = 0;
  for (const auto& b : bars) max = std::max(max, b.value);
  if (max <= 0) max = 1;
  std::string s = fmt::format(
      "<figure><figcaption>{}</figcaption><svg xmlns=\"http://www.w3.org/2000/svg\" "
      "width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\">\n",
      escape(title), W, H, W, H);
  for (size_t i = 0; i < bars.size(); ++i) {
    const auto& b = bars[i];
    const int y = 10 + static_cast<int>(i) * row;
    const double w = (W - left - 120) * b.value / max;
    s += fmt::format(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" font-size=\"13\">{}</text>"
        "<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"/>"
        "<text x=\"{:.1f}\" y=\"{}\" font-size=\"13\">{:.{}f} {}</text>\n",
        left - 8, y + 17, escape(b.label), left, y + 4, w, row - 8, b.color, left + w + 6, y + 17,
        b.value, digits, escape(unit));
  }
  s += "</svg></figure>\n";
  return s;
}

// One stacked bar (trunk | experts) per kind of bytes per token.
std::string stacked_bytes(const json& j) {
  const double trunk_read = num(j, "trunk_bytes_streamed_per_token");
  const double expert_read = num(j, "expert_bytes_read_per_token");
  const double touched = num(j, "decode_weight_bytes_per_token");
  const double ram_experts = num(j, "decode_experts_per_token") * num(j, "expert_bytes");
  const double ram_trunk = std::max(0.0, touched - ram_experts);
  struct Row {
    const char* label;
    double trunk, experts;
  };
  const std::vector<Row> rows = {{"read from storage", trunk_read, expert_read},
                                 {"touched in RAM", ram_trunk, ram_experts}};
  double max = 1;
  for (const auto& r : rows) max = std::max(max, r.trunk + r.experts);
  const int W = 640, left = 150, row = 34, H = 2 * row + 46;
  std::string s = fmt::format(
      "<figure><figcaption>Bytes per decoded token, trunk and experts</figcaption><svg "
      "xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "role=\"img\">\n",
      W, H, W, H);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const int y = 10 + static_cast<int>(i) * row;
    const double span = W - left - 20;
    const double wt = span * r.trunk / max, we = span * r.experts / max;
    s += fmt::format(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" font-size=\"13\">{}</text>"
        "<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"#2d5bd7\"><title>trunk "
        "{:.3f} MB</title></rect>"
        "<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" "
        "fill=\"#e08a1e\"><title>experts "
        "{:.3f} MB</title></rect>\n",
        left - 8, y + 19, r.label, left, y + 4, wt, row - 10, r.trunk / 1e6, left + wt, y + 4, we,
        row - 10, r.experts / 1e6);
  }
  s += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"#2d5bd7\"/><text x=\"{}\" "
      "y=\"{}\" font-size=\"12\">trunk</text><rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" "
      "fill=\"#e08a1e\"/><text x=\"{}\" y=\"{}\" font-size=\"12\">experts</text>\n",
      left, H - 22, left + 16, H - 12, left + 80, H - 22, left + 96, H - 12);
  s += "</svg></figure>\n";
  s += fmt::format(
      "<p>Storage: trunk {:.3f} MB + experts {:.3f} MB per token. RAM: trunk {:.3f} MB + experts "
      "{:.3f} MB per token.</p>\n",
      trunk_read / 1e6, expert_read / 1e6, ram_trunk / 1e6, ram_experts / 1e6);
  return s;
}

std::vector<Bar> per_rep(const json& j, const char* key, const char* color) {
  std::vector<Bar> bars;
  if (!j.contains(key)) return bars;
  for (size_t i = 0; i < j[key].size(); ++i)
    bars.push_back({fmt::format("repetition {}", i + 1), j[key][i].get<double>(), color});
  return bars;
}

}  // namespace

std::string bench_report_html(const json& j) {
  std::string h =
      "<!doctype html>\n<!-- deltafin bench report: self-contained (inline SVG, no script). "
      "-->\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>deltafin bench</title>\n"
      "<style>body{font:14px/1.5 system-ui,sans-serif;max-width:760px;margin:2rem auto;"
      "padding:0 1rem}figure{margin:1.5rem 0}figcaption{font-weight:600}td{padding:0 .75rem 0 "
      "0}</style></head><body>\n<h1>deltafin bench</h1>\n<table>\n";
  auto row = [&](const std::string& k, const std::string& v) {
    h += fmt::format("<tr><td>{}</td><td>{}</td></tr>\n", escape(k), escape(v));
  };
  row("model", j.value("model", ""));
  row("mode", j.value("mode", ""));
  row("machine", fmt::format("{}, {} threads, kernels {}", j.value("cpu", ""),
                             j.value("threads", 0), j.value("kernels", "")));
  row("run",
      fmt::format("{} prompt tokens, {} decoded tokens, {} repetitions",
                  j.value("prompt_tokens", 0), j.value("gen_tokens", 0), j.value("reps", 0)));
  row("decode", fmt::format("{:.3f} tokens/s median ({:.4f} s/token)",
                            num(j, "decode_tokens_per_s"), num(j, "s_per_token")));
  row("prefill", fmt::format("{:.2f} tokens/s median, time to first token {:.3f} s",
                             num(j, "prefill_tokens_per_s"), num(j, "ttft_s")));
  row("prefill passes",
      fmt::format("{:.0f} per prompt of up to {} rows ({}), {:.0f} bytes read per prompt token",
                  num(j, "prefill_passes_per_prompt"), j.value("prefill_chunk", int64_t{0}),
                  j.value("prefill_chunk_auto", false) ? "auto" : "--prefill-chunk",
                  num(j, "prefill_bytes_per_token")));
  row("prefill roofline ratio",
      fmt::format("{:.2f} (compute at {:.1f} of {:.1f} GFLOP/s peak)",
                  num(j, "prefill_roofline_ratio"), num(j, "prefill_flops_per_s") / 1e9,
                  num(j, "fma_peak_flops_per_s") / 1e9));
  if (j.value("draft", "none") != "none") {  // the text output's "drafting" line
    row("drafting",
        fmt::format("{}: {} proposed, {} accepted ({:.0f}%), {:.2f} tokens per target pass, "
                    "{:.3f} GB read per verified token",
                    j.value("draft", ""), j.value("draft_proposed", int64_t{0}),
                    j.value("draft_accepted", int64_t{0}), 100 * num(j, "draft_acceptance_rate"),
                    num(j, "tokens_per_pass"), num(j, "bytes_per_verified_token") / 1e9));
  }
  row("expert hit rate", fmt::format("{:.1f}%", 100 * num(j, "expert_hit_rate")));
  row("disk / memory bandwidth",
      fmt::format("{:.2f} / {:.2f} GB/s", num(j, "disk_bandwidth_bytes_per_s") / 1e9,
                  num(j, "memory_bandwidth_bytes_per_s") / 1e9));
  row("roofline ratio", fmt::format("{:.2f} (1.0 = at the bound)", num(j, "roofline_ratio")));
  const json* vision = j.contains("vision") && j["vision"].is_object() ? &j["vision"] : nullptr;
  if (vision != nullptr) {  // bench --image: the text output's "vision" lines
    row("vision tower",
        fmt::format("{:.1f} M + projector {:.1f} M parameters, {} layers; {} image{}, {} "
                    "image tokens, tower {:.3f} s (medians summed)",
                    num(*vision, "tower_params") / 1e6, num(*vision, "projector_params") / 1e6,
                    vision->value("layers", int64_t{0}), (*vision)["images"].size(),
                    (*vision)["images"].size() == 1 ? "" : "s",
                    vision->value("image_tokens", int64_t{0}), num(*vision, "tower_s")));
  }
  h += "</table>\n";
  if (vision != nullptr) {
    std::vector<Bar> bars;
    for (const auto& im : (*vision)["images"]) {
      const std::string file = im.value("file", "");
      const size_t slash = file.find_last_of('/');
      bars.push_back(
          {fmt::format("{} ({} tokens)", slash == std::string::npos ? file : file.substr(slash + 1),
                       im.value("tokens", int64_t{0})),
           im.contains("tower_s") ? num(im["tower_s"], "median") : 0.0, "#8e44ad"});
    }
    h += bar_chart("Vision tower: seconds per image (median)", bars, "s", 3);
  }
  h += bar_chart("Decode speed per repetition", per_rep(j, "decode_tokens_per_s_reps", "#2d5bd7"),
                 "tokens/s", 3);
  h += bar_chart("Prefill speed per repetition", per_rep(j, "prefill_tokens_per_s_reps", "#2a9d55"),
                 "tokens/s", 2);
  h += stacked_bytes(j);
  h += bar_chart("Roofline: seconds per decoded token",
                 {{"achieved", num(j, "s_per_token"), "#d64545"},
                  {"storage bound", num(j, "roofline_disk_s_per_token"), "#e08a1e"},
                  {"memory bound", num(j, "roofline_memory_s_per_token"), "#2d5bd7"}},
                 "s", 4);
  h += bar_chart(
      "Prefill roofline: seconds per prompt token",
      {{"achieved", num(j, "prefill_tokens_per_s") > 0 ? 1.0 / num(j, "prefill_tokens_per_s") : 0.0,
        "#d64545"},
       {"storage bound", num(j, "prefill_roofline_disk_s_per_token"), "#e08a1e"},
       {"compute bound", num(j, "prefill_roofline_compute_s_per_token"), "#2a9d55"}},
      "s", 5);
  h += "</body></html>\n";
  return h;
}

}  // namespace deltafin::cli
