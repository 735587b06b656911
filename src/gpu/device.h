// The Vulkan device under the backend (internal to src/gpu): the loader opened at run time,
// one compute queue, buffers (device-local, host-visible, or imported host memory), the
// embedded pipelines, and synchronous submission. It knows nothing about matrices; backend.cpp
// decides what goes where. Every Vulkan failure throws Error naming the call and its VkResult.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpu/gpu.h"

namespace deltafin::gpu {

struct Buffer;  // a VkBuffer with its memory (device.cpp)

// One compute dispatch: a pipeline (embedded module name and TM), up to six storage buffers
// (null: a small dummy), eleven push-constant words and the workgroup counts.
struct Dispatch {
  std::string module;
  uint32_t tm = 1;
  Buffer* buffers[6] = {};
  uint64_t offsets[6] = {};  // byte offsets of each binding
  uint32_t push[11] = {};
  uint32_t groups[3] = {1, 1, 1};
};

class Device {
 public:
  // Opens device `index` of probe(); throws Error when it cannot. `staged`: device buffers are
  // never mapped and nothing is imported, so every copy goes through the staging buffer.
  static std::unique_ptr<Device> open(int index, bool staged = false);
  ~Device();

  const DeviceInfo& info() const { return info_; }
  // Largest byte range one binding may cover (the storage-buffer limit, at most 1 GiB).
  uint64_t max_range() const;
  uint32_t max_groups_x() const { return max_groups_[0]; }

  // `bytes` of device-local memory (host-visible too when the device has such a type and
  // `host_visible` is asked); throws Error when out of memory.
  std::shared_ptr<Buffer> alloc(uint64_t bytes, bool host_visible = false);
  // Wraps [p, p + bytes) of host memory zero-copy; `offset` receives where p lies in the
  // buffer (the import is page-aligned). Null when the device or driver cannot import it.
  std::shared_ptr<Buffer> import(const void* p, uint64_t bytes, uint64_t& offset);
  // Copies host bytes in (mapped memcpy, or through the staging buffer) and out.
  void upload(Buffer& dst, uint64_t offset, const void* src, uint64_t bytes);
  void download(Buffer& src, uint64_t offset, void* dst, uint64_t bytes);
  // Records the dispatches (in order, a barrier after each) and submits them without waiting;
  // returns a ticket for wait(). Two submissions may be in flight: a third first waits for the
  // one two tickets before it, whose slot it takes. Copies (upload, download) queue behind
  // submitted work that writes what they read.
  uint64_t submit(std::span<const Dispatch> dispatches);
  // Waits until the submission `ticket` has finished (at once if it already has).
  void wait(uint64_t ticket);
  // submit() and wait().
  void run(std::span<const Dispatch> dispatches);

  struct Impl;

 private:
  explicit Device(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  DeviceInfo info_;
  uint32_t max_groups_[3] = {65535, 65535, 65535};
};

uint64_t buffer_size(const Buffer& b);

}  // namespace deltafin::gpu
