// The runtime's side of K3's image input (docs/VISION.md §6, §11.7): the chat renderer lays out an
// image's segment from what image_measurer answers (headers only, no decoding), and a sequence
// turns the images of its prompt into the rows its prefill passes take in place of the
// <|media_pad|> embeddings (PositionRows, generate/round.h). Both sit here, between the renderer
// (tokenizer layer, which knows no images) and the vision encoder (engine layer), so that every
// front end — run, chat, the server, the C API — renders and encodes images the same way.
#pragma once

#include <cstdint>
#include <span>

#include "engine/vision_encoder.h"
#include "generate/round.h"
#include "tokenizer/chat.h"

namespace deltafin {

// The renderer's measurer over `encoder` (its plan: decoded size, token count, every limit, from
// the headers) with the bytes' SHA-256. `encoder` null (a checkpoint without a vision tower): an
// image is an InvalidArgument naming it (a server answers 400).
ImageMeasurer image_measurer(const VisionEncoder* encoder);

struct ImageEncodeStats {
  int64_t images = 0;          // in the prompt
  int64_t tokens = 0;          // their <|media_pad|> tokens
  int64_t encoded = 0;         // encoded by the tower (those not wholly in the kept prefix)
  int64_t encoded_tokens = 0;  // their image tokens
  double seconds = 0;          // decoding, preprocessing, tower and projector
};

// The projector rows of the images of a prompt `ids` whose pads lie at or after position `from`
// (the earlier ones are in the state already), at their absolute positions. Checks each image's
// span against `ids` (its pads are `placeholder` ids) and the tower's width against `width`.
// Throws InvalidArgument naming the image for a bad image or a model without a tower.
PositionRows encode_prompt_images(const VisionEncoder* encoder, std::span<const int32_t> ids,
                                  std::span<const PromptImage> images, int64_t from, int64_t width,
                                  ImageEncodeStats* stats);

}  // namespace deltafin
