// `bench --image` (see bench_vision.h). A named step of `bench`: run after the prefill and decode
// repetitions, on the same loaded engine and threads, so the figures sit side by side. Each
// repetition encodes the image from its bytes, as a request does (decode, preprocess, tower,
// projector); the first repetition also faults the tower's mapped weights in, which is why the
// median is reported with the min and max.
#include "cli/bench_vision.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "core/sysinfo.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "core/units.h"
#include "model/vision_tower.h"
#include "vision/image.h"

namespace deltafin::cli {

namespace {

// Median, min and max of a few timings.
nlohmann::json vision_spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double median = n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return {{"median", median}, {"min", n ? v.front() : 0.0}, {"max", n ? v.back() : 0.0}};
}

}  // namespace

std::vector<BenchImage> read_bench_images(const std::vector<std::string>& paths) {
  std::vector<BenchImage> out;
  for (const std::string& p : paths) {
    BenchImage im;
    im.path = p;
    im.bytes = vision::read_image_file(p);
    (void)vision::probe_image(im.bytes, p);  // not an image, or over a limit: said now
    out.push_back(std::move(im));
  }
  return out;
}

nlohmann::json bench_images(const LoadedEngine& engine, const std::vector<BenchImage>& images,
                            int reps) {
  const VisionEncoder* enc = engine.vision.get();
  if (enc == nullptr) {
    fail_arg(
        "--image {}: the model has no vision tower (no vision_tower.* / mm_projector.* tensors), "
        "so there is no image cost to measure",
        images.front().path);
  }
  const VisionConfig& vc = enc->config();
  const VisionCost cost = vision_cost(vc);
  const LoadedModel& model = *engine.model;
  const int threads = global_pool().size();
  nlohmann::json list = nlohmann::json::array();
  double total = 0;
  int64_t tokens = 0;
  for (const BenchImage& im : images) {
    vision::ImageInfo info;
    const vision::ImagePlan plan = enc->plan(im.bytes, im.path, &info);
    std::vector<double> pre, tower, whole;
    for (int r = 0; r < reps; ++r) {
      Stopwatch sw;
      const ImageEmbedding e = enc->encode(im.bytes, im.path);
      whole.push_back(sw.elapsed());
      pre.push_back(e.preprocess_seconds);
      tower.push_back(e.tower_seconds);
      if (e.tokens != plan.num_tokens)
        fail("{}: the tower gave {} rows, its plan {}", im.path, e.tokens, plan.num_tokens);
    }
    const nlohmann::json t = vision_spread(tower);
    total += t["median"].get<double>();
    tokens += plan.num_tokens;
    list.push_back(
        {{"file", im.path},
         {"format", vision::format_name(info.format)},
         {"width", info.width},
         {"height", info.height},
         {"resized", {plan.new_width, plan.new_height}},
         {"grid", {plan.grid_h, plan.grid_w}},
         {"patches", plan.patches()},
         {"tokens", plan.num_tokens},
         {"preprocess_s", vision_spread(pre)},
         {"tower_s", t},
         {"seconds", vision_spread(whole)},
         {"tower_flops", vision_flops(vc, VisionGrid{1, plan.grid_h, plan.grid_w}).total()},
         {"work_bytes", vision_work_bytes(vc, plan.patches(), threads)}});
  }
  nlohmann::json j;
  j["tower_params"] = cost.tower_params;
  j["projector_params"] = cost.projector_params;
  j["layers"] = vc.layers;
  j["hidden"] = vc.hidden;
  j["text_hidden"] = vc.text_hidden;
  j["weight_bytes"] = cost.weight_bytes;
  if (model.plan()) j["plan_work_bytes"] = model.plan()->vision_work_bytes;
  j["reps"] = reps;
  j["images"] = list;
  j["image_tokens"] = tokens;
  j["tower_s"] = total;
  j["peak_rss_bytes"] = peak_rss_bytes();  // the whole run's, the tower's images included
  return j;
}

void print_bench_images(const nlohmann::json& v) {
  fmt::print(
      "vision     tower {:.1f} M + projector {:.1f} M parameters ({} layers, D {} -> {}), weights "
      "{} resident\n",
      v["tower_params"].get<double>() / 1e6, v["projector_params"].get<double>() / 1e6,
      v["layers"].get<int64_t>(), v["hidden"].get<int64_t>(), v["text_hidden"].get<int64_t>(),
      human_bytes(v["weight_bytes"].get<double>()));
  for (const auto& im : v["images"]) {
    fmt::print(
        "image      {} {}x{} -> {} patches ({}x{}) -> {} image tokens: tower {:.3f} s median (min "
        "{:.3f}, max {:.3f}), decode + preprocess {:.3f} s, {:.1f} GFLOP, working memory {}\n",
        im["file"].get<std::string>(), im["width"].get<int64_t>(), im["height"].get<int64_t>(),
        im["patches"].get<int64_t>(), im["grid"][0].get<int64_t>(), im["grid"][1].get<int64_t>(),
        im["tokens"].get<int64_t>(), im["tower_s"]["median"].get<double>(),
        im["tower_s"]["min"].get<double>(), im["tower_s"]["max"].get<double>(),
        im["preprocess_s"]["median"].get<double>(), im["tower_flops"].get<double>() / 1e9,
        human_bytes(im["work_bytes"].get<double>()));
  }
  fmt::print("vision     peak RSS {:.2f} GiB after the images\n",
             v["peak_rss_bytes"].get<double>() / 1073741824.0);
}

}  // namespace deltafin::cli
