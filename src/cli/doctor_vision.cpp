// `deltafin doctor`'s vision section: what K3's vision tower costs on this machine, for the
// released shape (its 401 M-parameter tower and projector, known from vision_config alone) and for
// a checkpoint that holds one (`make-model --vision`). It is built here, in the command line,
// because it needs the image processor's resize rule (src/vision) to turn an image size into a
// patch grid, and the doctor layer sits below the image layer.
//
// The time per image is a forecast, like the rest of doctor's: the tower's arithmetic
// (model/vision_tower.h vision_flops) at the rates measured here — its products with the weights
// at the BF16 GEMM rate, attention's at the float32 rate. docs/PERFORMANCE.md sets it beside the
// measured time (`bench --image`).
#include <fmt/format.h>

#include <exception>
#include <filesystem>

#include "cli/doctor.h"
#include "core/mapped_file.h"
#include "model/vision_config.h"
#include "model/vision_tower.h"
#include "vision/preprocess.h"

namespace deltafin::cli {

namespace {

// The image sizes the forecast is given for: a small image, a 4:3 photo, a 1080p screenshot.
struct DoctorImageSize {
  int64_t width, height;
};
constexpr DoctorImageSize kDoctorImageSizes[] = {{448, 448}, {1024, 768}, {1920, 1080}};

}  // namespace

DoctorReport doctor_vision(const ModelConfig& c, const MemoryPlan& plan, const KernelSpeeds& s,
                           const std::string& model_dir) {
  const VisionConfig v = vision_config_of(c);
  vision::MediaProcConfig media = vision::release_media_proc_config();
  std::string media_from = "the release's media_proc_cfg";
  std::string media_error;
  if (!model_dir.empty()) {
    // A checkpoint's own processor; without a readable one (the encoder would refuse to open),
    // the forecast uses the release's and says why.
    const std::string pre =
        (std::filesystem::path(model_dir) / "preprocessor_config.json").string();
    try {
      media = vision::parse_media_proc_config(read_regular_file(pre), pre);
      media_from = pre;
    } catch (const std::exception& e) {
      media_error = e.what();
    }
  }
  const VisionCost cost = vision_cost(v);
  DoctorReport j;
  j["tower_params"] = cost.tower_params;
  j["projector_params"] = cost.projector_params;
  j["layers"] = v.layers;
  j["hidden"] = v.hidden;
  j["weight_bytes"] = plan.vision_weight_bytes;
  j["work_bytes"] = plan.vision_work_bytes;
  j["max_patches"] = plan.vision_max_patches;
  j["media_proc_cfg"] = media_from;
  if (!media_error.empty()) j["media_proc_cfg_error"] = media_error;
  j["resident"] = true;
  DoctorReport images = DoctorReport::array();
  for (const DoctorImageSize& size : kDoctorImageSizes) {
    const vision::ImagePlan p = vision::plan_image(size.width, size.height, media);
    const VisionFlops f = vision_flops(v, VisionGrid{1, p.grid_h, p.grid_w});
    const double seconds = (s.bf16_gemm > 0 ? f.linear / s.bf16_gemm : 0.0) +
                           (s.f32_gemm > 0 ? f.attention / s.f32_gemm : 0.0);
    images.push_back({{"width", size.width},
                      {"height", size.height},
                      {"grid_h", p.grid_h},
                      {"grid_w", p.grid_w},
                      {"patches", p.patches()},
                      {"tokens", p.num_tokens},
                      {"flops", f.total()},
                      {"attention_flops", f.attention},
                      {"work_bytes", vision_work_bytes(v, p.patches(), 1)},
                      {"forecast_s", seconds}});
  }
  j["images"] = images;
  return j;
}

std::string doctor_vision_text(const DoctorReport& j) {
  auto num = [](const DoctorReport& o, const char* k) { return o.value(k, 0.0); };
  std::string o = fmt::format(
      "  vision     tower {:.1f} M + projector {:.1f} M parameters ({} layers, D {}), resident "
      "{:.2f} GiB + {:.2f} GiB working memory for the largest image ({:.0f} patches)\n",
      num(j, "tower_params") / 1e6, num(j, "projector_params") / 1e6, num(j, "layers"),
      num(j, "hidden"), num(j, "weight_bytes") / 1073741824.0, num(j, "work_bytes") / 1073741824.0,
      num(j, "max_patches"));
  for (const auto& im : j["images"]) {
    o += fmt::format(
        "  per image  {:.0f}x{:.0f}: {:.0f} patches -> {:.0f} image tokens (prompt tokens for the "
        "trunk), tower {:.1f} s forecast ({:.0f} GFLOP)\n",
        num(im, "width"), num(im, "height"), num(im, "patches"), num(im, "tokens"),
        num(im, "forecast_s"), num(im, "flops") / 1e9);
  }
  return o;
}

}  // namespace deltafin::cli
