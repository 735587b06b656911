// The per-sequence tap buffer (see taps.h): committed rows in one contiguous vector starting at
// begin_, staged rows of the current pass in another; publishing appends a prefix of the staged
// rows. Everything is fp32 (taps feed a draft model whose output is compared at 2e-3).
#include "model/taps.h"

#include <algorithm>

#include "core/enum_names.h"
#include "core/error.h"

namespace deltafin {

constexpr EnumName<TapStream> kTapStreamNames[] = {{TapStream::kPartial, "prefix"},
                                                   {TapStream::kMixture, "attn_res"},
                                                   {TapStream::kFinal, "final_norm"}};

const char* tap_stream_name(TapStream s) {
  return name_of(kTapStreamNames, s);
}

void validate_taps(const TapSpec& spec, const ModelConfig& c, const std::string& who) {
  if (spec.layers.empty()) fail("{}: no target layers to tap", who);
  const int64_t limit = spec.stream == TapStream::kMixture ? c.num_layers - 1 : c.num_layers;
  for (int l : spec.layers) {
    if (l < 0 || l >= limit) {
      fail(
          "{}: tap layer {} is beyond the target model ({} layers; the {} stream needs a layer "
          "in 0..{})",
          who, l, c.num_layers, tap_stream_name(spec.stream), limit - 1);
    }
  }
}

TapRecorder::TapRecorder(TapSpec spec, int64_t hidden) : spec_(std::move(spec)), hidden_(hidden) {}

const float* TapRecorder::row(int64_t position) const {
  if (position < begin() || position >= end())
    fail("internal: tap row {} requested, rows {}..{} held", position, begin(), end());
  return committed_.data() + (position - begin_) * width();
}

void TapRecorder::consume_until(int64_t position) {
  const int64_t n = std::clamp<int64_t>(position - begin_, 0, end() - begin_);
  committed_.erase(committed_.begin(), committed_.begin() + n * width());
  begin_ += n;
}

float* TapRecorder::stage(int64_t base, int64_t rows) {
  if (base < end()) {
    truncate(base);
  } else if (base > end()) {
    committed_.clear();
  }
  if (committed_.empty()) begin_ = base;
  staged_base_ = base;
  staged_rows_ = rows;
  staged_.assign(static_cast<size_t>(rows * width()), 0.0f);
  return staged_.data();
}

void TapRecorder::publish(int64_t accepted) {
  if (accepted < 0 || accepted > staged_rows_)
    fail("internal: publishing {} tap rows of a pass of {}", accepted, staged_rows_);
  if (staged_base_ != end()) {
    // The committed rows moved since the pass (a truncate or clear): keep only what is contiguous.
    if (staged_base_ < begin_ || staged_base_ > end()) committed_.clear();
    if (committed_.empty())
      begin_ = staged_base_;
    else
      truncate(staged_base_);
  }
  committed_.insert(committed_.end(), staged_.begin(), staged_.begin() + accepted * width());
  staged_rows_ = 0;
  staged_.clear();
}

void TapRecorder::truncate(int64_t n) {
  if (n <= begin_) {
    committed_.clear();
    begin_ = n;
    return;
  }
  if (n < end()) committed_.resize(static_cast<size_t>((n - begin_) * width()));
}

void TapRecorder::restart(int64_t position) {
  clear();
  begin_ = position;
}

void TapRecorder::clear() {
  committed_.clear();
  staged_.clear();
  begin_ = 0;
  staged_base_ = staged_rows_ = 0;
}

}  // namespace deltafin
