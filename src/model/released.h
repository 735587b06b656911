// The released models' shapes, as their config.json files state them: what `deltafin doctor`
// plans and forecasts when it is given no checkpoint, and what `make-model`'s presets shrink.
// Each entry is the text model's configuration in the release's own words (the fields the parser
// reads, with the release's values), parsed by the same parse_config as a checkpoint on disk, so
// a shape here can never disagree with what loading the release would build.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace deltafin {

struct ReleasedModel {
  std::string name;          // the short name `doctor --shape` and the presets use
  std::string title;         // what people call it ("Kimi K3")
  std::string repo;          // where the checkpoint is published
  std::string config_json;   // the release's config.json (text model fields)
  uint64_t shard_bytes = 0;  // the release's shard size, about
  ModelConfig config() const { return parse_config(config_json, repo + " (released shape)"); }
};

// Every release this build knows the shape of, in a stable order.
const std::vector<ReleasedModel>& released_models();
// The release named `name`; throws InvalidArgument naming the known ones otherwise.
const ReleasedModel& released_model(const std::string& name);
// The short name of the release a checkpoint's config belongs to, by family, model_type and
// expert format (a Kimi K2 with INT4 experts is K2-Thinking): what `serve` calls the model when
// --model-id is not given.
std::string release_name_of(const ModelConfig& c);

}  // namespace deltafin
