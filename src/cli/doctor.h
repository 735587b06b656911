// `deltafin doctor`: what this machine is, what Kimi K3 (or a checkpoint folder) needs, and what
// the engine will do with it here — the memory plan, the bytes a token reads and touches, and
// the decode and prefill speeds forecast from speeds measured on this machine
// (doctor/forecast.h) — plus a file-by-file check of a checkpoint (storage/checkpoint_check.h).
// cmd_doctor.cpp gathers everything into one JSON report (docs/DOCTOR.md documents it);
// doctor_text.cpp writes the same report as plain sentences.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "doctor/forecast.h"
#include "model/config.h"
#include "storage/plan.h"

namespace deltafin::cli {

using DoctorReport = nlohmann::ordered_json;

// The plain-text report (what `doctor` prints without --json).
std::string doctor_text(const DoctorReport& r);

// The "vision" object (doctor_vision.cpp) of a model with a vision tower: its parameters, the
// plan's share for it, and per image size the patches, image tokens and forecast tower seconds.
// `model_dir` empty: the released shape (the release's media_proc_cfg).
DoctorReport doctor_vision(const ModelConfig& c, const MemoryPlan& plan, const KernelSpeeds& s,
                           const std::string& model_dir);
std::string doctor_vision_text(const DoctorReport& vision);

}  // namespace deltafin::cli
