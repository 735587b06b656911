// `deltafin bench --image FILE` (repeatable; bench_vision.cpp): what K3's vision tower costs per
// image, beside the prefill and decode figures — the image's patch grid and token count, the
// time to decode and preprocess it and to run the tower and projector (median, min and max over
// the repetitions), and the tower's memory: its weights as bound (resident, storage/plan.h) and
// the working memory of this image (model/vision_tower.h vision_work_bytes).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/load.h"

namespace deltafin::cli {

// One image as read before the model loads: its bytes, checked as a file and by its headers.
struct BenchImage {
  std::string path;
  std::vector<uint8_t> bytes;
};

// Reads and probes every --image before anything slow runs; throws InvalidArgument naming the
// file that is missing, too large or not an image.
std::vector<BenchImage> read_bench_images(const std::vector<std::string>& paths);

// Encodes each image `reps` times with the engine's tower. Throws InvalidArgument when the model
// has no vision tower, or naming an image that fails to decode.
nlohmann::json bench_images(const LoadedEngine& engine, const std::vector<BenchImage>& images,
                            int reps);

// The "vision" lines of the text report.
void print_bench_images(const nlohmann::json& vision);

}  // namespace deltafin::cli
