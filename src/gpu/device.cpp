// The Vulkan device (see device.h). The loader is opened with dlopen and every entry point is
// fetched through vkGetInstanceProcAddr / vkGetDeviceProcAddr (VK_NO_PROTOTYPES), so nothing
// links against libvulkan: a machine without Vulkan gets a clear "no loader" from probe() and
// runs on the CPU. Copies (staged uploads and read-backs) are synchronous (their own command
// buffer and fence). Dispatches go through two submission slots, each with its command buffer,
// fence and descriptor pool: submit() returns at once so the caller can fill the other slot's
// buffers while the device computes (the backend's double-buffered uploads), and a slot is
// reused only after its previous work has finished, so no buffer is rewritten while in flight.
#include "gpu/device.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "core/error.h"

#if DELTAFIN_HAVE_VULKAN
#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include "gpu/shaders.h"
#endif

namespace deltafin::gpu {

bool compiled_in() {
#if DELTAFIN_HAVE_VULKAN
  return true;
#else
  return false;
#endif
}

std::string DeviceInfo::describe() const {
  return fmt::format("{}: {} ({}, Vulkan {}.{}, {:.1f} GiB device memory, {} MiB per buffer{})",
                     index, name, type, api_version >> 22, (api_version >> 12) & 0x3FF,
                     static_cast<double>(device_local_bytes) / (1 << 30), max_buffer_bytes >> 20,
                     host_import ? ", host-memory import" : "");
}

#if !DELTAFIN_HAVE_VULKAN

struct Buffer {};
struct Device::Impl {};
Probe probe() {
  return {{}, "this build has no Vulkan backend (configured without libvulkan-dev and glslc)"};
}
std::unique_ptr<Device> Device::open(int, bool) {
  fail("this build has no Vulkan backend (configured without libvulkan-dev and glslc)");
}
Device::Device(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Device::~Device() = default;
uint64_t Device::max_range() const {
  return 0;
}
std::shared_ptr<Buffer> Device::alloc(uint64_t, bool) {
  fail("no Vulkan backend");
}
std::shared_ptr<Buffer> Device::import(const void*, uint64_t, uint64_t&) {
  return nullptr;
}
void Device::upload(Buffer&, uint64_t, const void*, uint64_t) {}
void Device::download(Buffer&, uint64_t, void*, uint64_t) {}
uint64_t Device::submit(std::span<const Dispatch>) {
  return 0;
}
void Device::wait(uint64_t) {}
void Device::run(std::span<const Dispatch>) {}
uint64_t buffer_size(const Buffer&) {
  return 0;
}

#else

namespace {

// The entry points used, fetched at run time.
#define DELTAFIN_VK_INSTANCE_FNS(X)           \
  X(vkDestroyInstance)                        \
  X(vkEnumeratePhysicalDevices)               \
  X(vkGetPhysicalDeviceProperties)            \
  X(vkGetPhysicalDeviceProperties2)           \
  X(vkGetPhysicalDeviceMemoryProperties)      \
  X(vkGetPhysicalDeviceQueueFamilyProperties) \
  X(vkEnumerateDeviceExtensionProperties)     \
  X(vkCreateDevice)                           \
  X(vkGetDeviceProcAddr)
#define DELTAFIN_VK_DEVICE_FNS(X)  \
  X(vkDestroyDevice)               \
  X(vkGetDeviceQueue)              \
  X(vkCreateBuffer)                \
  X(vkDestroyBuffer)               \
  X(vkGetBufferMemoryRequirements) \
  X(vkAllocateMemory)              \
  X(vkFreeMemory)                  \
  X(vkBindBufferMemory)            \
  X(vkMapMemory)                   \
  X(vkCreateShaderModule)          \
  X(vkDestroyShaderModule)         \
  X(vkCreateDescriptorSetLayout)   \
  X(vkDestroyDescriptorSetLayout)  \
  X(vkCreatePipelineLayout)        \
  X(vkDestroyPipelineLayout)       \
  X(vkCreateComputePipelines)      \
  X(vkDestroyPipeline)             \
  X(vkCreateDescriptorPool)        \
  X(vkDestroyDescriptorPool)       \
  X(vkResetDescriptorPool)         \
  X(vkAllocateDescriptorSets)      \
  X(vkUpdateDescriptorSets)        \
  X(vkCreateCommandPool)           \
  X(vkDestroyCommandPool)          \
  X(vkAllocateCommandBuffers)      \
  X(vkBeginCommandBuffer)          \
  X(vkEndCommandBuffer)            \
  X(vkResetCommandBuffer)          \
  X(vkCmdBindPipeline)             \
  X(vkCmdBindDescriptorSets)       \
  X(vkCmdPushConstants)            \
  X(vkCmdDispatch)                 \
  X(vkCmdCopyBuffer)               \
  X(vkCmdPipelineBarrier)          \
  X(vkQueueSubmit)                 \
  X(vkCreateFence)                 \
  X(vkDestroyFence)                \
  X(vkWaitForFences)               \
  X(vkResetFences)

struct Api {
  void* lib = nullptr;
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
  PFN_vkCreateInstance vkCreateInstance = nullptr;
  VkInstance instance = VK_NULL_HANDLE;
#define X(f) PFN_##f f = nullptr;
  DELTAFIN_VK_INSTANCE_FNS(X)
#undef X
  std::string error;  // why there is no instance
};

[[noreturn]] void vk_fail(const char* what, VkResult r) {
  fail("Vulkan {} failed (VkResult {})", what, static_cast<int>(r));
}
void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS) vk_fail(what, r);
}

// The process's loader and instance, made on first use and kept (drivers dislike repeated
// instance creation, and the probe and every backend share them).
Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    a.lib = ::dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (a.lib == nullptr) {
      a.error =
          "no Vulkan loader (libvulkan.so.1; Debian: libvulkan1 and a driver such as "
          "mesa-vulkan-drivers)";
      return;
    }
    a.vkGetInstanceProcAddr =
        reinterpret_cast<PFN_vkGetInstanceProcAddr>(::dlsym(a.lib, "vkGetInstanceProcAddr"));
    if (a.vkGetInstanceProcAddr == nullptr) {
      a.error = "libvulkan.so.1 has no vkGetInstanceProcAddr";
      return;
    }
    a.vkCreateInstance = reinterpret_cast<PFN_vkCreateInstance>(
        a.vkGetInstanceProcAddr(VK_NULL_HANDLE, "vkCreateInstance"));
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "deltafin";
    app.apiVersion = VK_API_VERSION_1_1;
    VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ci.pApplicationInfo = &app;
    VkResult r = a.vkCreateInstance != nullptr ? a.vkCreateInstance(&ci, nullptr, &a.instance)
                                               : VK_ERROR_INITIALIZATION_FAILED;
    if (r != VK_SUCCESS) {
      a.error = fmt::format(
          "the Vulkan loader found no driver supporting Vulkan 1.1 (vkCreateInstance: VkResult "
          "{})",
          static_cast<int>(r));
      return;
    }
#define X(f) a.f = reinterpret_cast<PFN_##f>(a.vkGetInstanceProcAddr(a.instance, #f));
    DELTAFIN_VK_INSTANCE_FNS(X)
#undef X
  });
  return a;
}

std::vector<VkPhysicalDevice> physical_devices(Api& a) {
  uint32_t n = 0;
  check(a.vkEnumeratePhysicalDevices(a.instance, &n, nullptr), "vkEnumeratePhysicalDevices");
  std::vector<VkPhysicalDevice> d(n);
  check(a.vkEnumeratePhysicalDevices(a.instance, &n, d.data()), "vkEnumeratePhysicalDevices");
  d.resize(n);
  return d;
}

bool has_extension(Api& a, VkPhysicalDevice pd, const char* name) {
  uint32_t n = 0;
  a.vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> e(n);
  a.vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, e.data());
  for (uint32_t i = 0; i < n; ++i)
    if (std::strcmp(e[i].extensionName, name) == 0) return true;
  return false;
}

DeviceInfo describe_device(Api& a, VkPhysicalDevice pd, int index) {
  VkPhysicalDeviceProperties p;
  a.vkGetPhysicalDeviceProperties(pd, &p);
  VkPhysicalDeviceMemoryProperties mp;
  a.vkGetPhysicalDeviceMemoryProperties(pd, &mp);
  DeviceInfo d;
  d.index = index;
  d.name = p.deviceName;
  switch (p.deviceType) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      d.type = "discrete";
      break;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      d.type = "integrated";
      break;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      d.type = "virtual";
      break;
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      d.type = "cpu";
      break;
    default:
      d.type = "other";
  }
  d.api_version = p.apiVersion;
  for (uint32_t h = 0; h < mp.memoryHeapCount; ++h)
    if (mp.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
      d.device_local_bytes = std::max<uint64_t>(d.device_local_bytes, mp.memoryHeaps[h].size);
  d.max_buffer_bytes = p.limits.maxStorageBufferRange;
  d.host_import = has_extension(a, pd, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
  d.unified = p.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU ||
              p.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  return d;
}

}  // namespace

Probe probe() {
  Probe out;
  Api& a = api();
  if (a.instance == VK_NULL_HANDLE) {
    out.error = a.error;
    return out;
  }
  try {
    std::vector<VkPhysicalDevice> pds = physical_devices(a);
    for (size_t i = 0; i < pds.size(); ++i)
      out.devices.push_back(describe_device(a, pds[i], static_cast<int>(i)));
    if (pds.empty()) out.error = "the Vulkan loader found no device";
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

struct Buffer {
  Device::Impl* owner = nullptr;
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  uint64_t size = 0;
  uint8_t* mapped = nullptr;  // host-visible memory, mapped for the buffer's life
  ~Buffer();
};

uint64_t buffer_size(const Buffer& b) {
  return b.size;
}

struct Device::Impl {
  Api& a;
  VkPhysicalDevice pd = VK_NULL_HANDLE;
  VkPhysicalDeviceProperties props{};
  VkPhysicalDeviceMemoryProperties mem{};
  VkDevice dev = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  uint32_t family = 0;
  VkCommandPool cmd_pool = VK_NULL_HANDLE;
  VkCommandBuffer cmd = VK_NULL_HANDLE;  // copies
  VkFence fence = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  VkPipelineLayout pipe_layout = VK_NULL_HANDLE;
  // The two submission slots for dispatches (ticket t uses slot t % 2).
  struct Slot {
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    VkDescriptorPool pool = VK_NULL_HANDLE;
    uint32_t pool_sets = 0;
    uint64_t ticket = 0;
    bool busy = false;
  };
  Slot slots[2];
  uint64_t next_ticket = 1;
  std::map<std::pair<std::string, uint32_t>, VkPipeline> pipelines;
  std::map<std::string, VkShaderModule> modules;
  bool import = false;
  bool staged = false;  // map only buffers asked to be host-visible
  uint64_t import_align = 4096;
  PFN_vkGetMemoryHostPointerPropertiesEXT get_host_ptr_props = nullptr;
  std::shared_ptr<Buffer> staging;  // host-visible, for devices whose local memory is not
  std::shared_ptr<Buffer> dummy;
#define X(f) PFN_##f f = nullptr;
  DELTAFIN_VK_DEVICE_FNS(X)
#undef X

  explicit Impl(Api& api) : a(api) {}
  ~Impl() {
    if (dev == VK_NULL_HANDLE) return;
    staging.reset();
    dummy.reset();
    for (auto& [k, p] : pipelines) vkDestroyPipeline(dev, p, nullptr);
    for (auto& [k, m] : modules) vkDestroyShaderModule(dev, m, nullptr);
    for (Slot& sl : slots) {
      if (sl.busy) vkWaitForFences(dev, 1, &sl.fence, VK_TRUE, UINT64_MAX);
      if (sl.pool) vkDestroyDescriptorPool(dev, sl.pool, nullptr);
      if (sl.fence) vkDestroyFence(dev, sl.fence, nullptr);
    }
    if (pipe_layout) vkDestroyPipelineLayout(dev, pipe_layout, nullptr);
    if (set_layout) vkDestroyDescriptorSetLayout(dev, set_layout, nullptr);
    if (fence) vkDestroyFence(dev, fence, nullptr);
    if (cmd_pool) vkDestroyCommandPool(dev, cmd_pool, nullptr);
    vkDestroyDevice(dev, nullptr);
  }

  // A memory type among `bits` with all of `want` (and preferably `prefer`); -1 if none.
  int memory_type(uint32_t bits, VkMemoryPropertyFlags want, VkMemoryPropertyFlags prefer) const {
    int fallback = -1;
    for (uint32_t i = 0; i < mem.memoryTypeCount; ++i) {
      if (!(bits & (1u << i))) continue;
      VkMemoryPropertyFlags f = mem.memoryTypes[i].propertyFlags;
      if ((f & want) != want) continue;
      if ((f & prefer) == prefer) return static_cast<int>(i);
      if (fallback < 0) fallback = static_cast<int>(i);
    }
    return fallback;
  }

  std::shared_ptr<Buffer> make_buffer(uint64_t bytes, bool host_visible, const void* host_ptr) {
    auto b = std::make_shared<Buffer>();
    b->owner = this;
    b->size = bytes;
    VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bi.size = bytes;
    bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
               VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    VkExternalMemoryBufferCreateInfo ext{VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO};
    ext.handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
    if (host_ptr != nullptr) bi.pNext = &ext;
    check(vkCreateBuffer(dev, &bi, nullptr, &b->buffer), "vkCreateBuffer");
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev, b->buffer, &req);
    VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    VkImportMemoryHostPointerInfoEXT imp{VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT};
    int type = -1;
    if (host_ptr != nullptr) {
      VkMemoryHostPointerPropertiesEXT hp{VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT};
      if (get_host_ptr_props(dev, VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT, host_ptr,
                             &hp) != VK_SUCCESS)
        return nullptr;
      type = memory_type(req.memoryTypeBits & hp.memoryTypeBits, 0, 0);
      if (type < 0) return nullptr;
      imp.handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
      imp.pHostPointer = const_cast<void*>(host_ptr);
      ai.pNext = &imp;
      ai.allocationSize = bytes;
    } else {
      VkMemoryPropertyFlags want =
          host_visible ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
                       : 0;
      type = memory_type(req.memoryTypeBits, want, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
      if (type < 0)
        fail("Vulkan: no memory type for a {} buffer", host_visible ? "host" : "device");
      ai.allocationSize = req.size;
    }
    ai.memoryTypeIndex = static_cast<uint32_t>(type);
    VkResult r = vkAllocateMemory(dev, &ai, nullptr, &b->memory);
    if (r != VK_SUCCESS) {
      if (host_ptr != nullptr) return nullptr;  // the caller copies instead
      fail("Vulkan: out of device memory allocating {} MiB (VkResult {})", bytes >> 20,
           static_cast<int>(r));
    }
    check(vkBindBufferMemory(dev, b->buffer, b->memory, 0), "vkBindBufferMemory");
    VkMemoryPropertyFlags flags = mem.memoryTypes[type].propertyFlags;
    if (host_ptr == nullptr && (host_visible || !staged) &&
        (flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) &&
        (flags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)) {
      void* p = nullptr;
      check(vkMapMemory(dev, b->memory, 0, VK_WHOLE_SIZE, 0, &p), "vkMapMemory");
      b->mapped = static_cast<uint8_t*>(p);
    }
    return b;
  }

  void begin(VkCommandBuffer c) {
    check(vkResetCommandBuffer(c, 0), "vkResetCommandBuffer");
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    check(vkBeginCommandBuffer(c, &bi), "vkBeginCommandBuffer");
  }
  void begin() {
    begin(cmd);
  }
  void submit(VkCommandBuffer c, VkFence f) {
    check(vkEndCommandBuffer(c), "vkEndCommandBuffer");
    check(vkResetFences(dev, 1, &f), "vkResetFences");
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &c;
    check(vkQueueSubmit(queue, 1, &si, f), "vkQueueSubmit");
  }
  void submit_and_wait() {
    submit(cmd, fence);
    check(vkWaitForFences(dev, 1, &fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
  }
  // Copies `bytes` between a device buffer at `offset` and host memory: from `from_host` (an
  // upload) or into `to_host` (a download; the other pointer is null). A mapped buffer is copied
  // directly, any other through the staging buffer 64 MiB at a time.
  void transfer(Buffer& buf, uint64_t offset, uint64_t bytes, const uint8_t* from_host,
                uint8_t* to_host) {
    if (bytes == 0) return;
    if (offset + bytes > buf.size) fail("internal: a transfer past the end of a device buffer");
    if (buf.mapped != nullptr) {
      if (from_host != nullptr) std::memcpy(buf.mapped + offset, from_host, bytes);
      if (to_host != nullptr) std::memcpy(to_host, buf.mapped + offset, bytes);
      return;
    }
    const uint64_t chunk = 64ull << 20;
    if (!staging) staging = make_buffer(chunk, true, nullptr);
    for (uint64_t done = 0; done < bytes; done += chunk) {
      const uint64_t n = std::min(chunk, bytes - done);
      begin();
      if (from_host != nullptr) {
        std::memcpy(staging->mapped, from_host + done, n);
        VkBufferCopy region{0, offset + done, n};
        vkCmdCopyBuffer(cmd, staging->buffer, buf.buffer, 1, &region);
      } else {
        VkBufferCopy region{offset + done, 0, n};
        vkCmdCopyBuffer(cmd, buf.buffer, staging->buffer, 1, &region);
      }
      submit_and_wait();
      if (to_host != nullptr) std::memcpy(to_host + done, staging->mapped, n);
    }
  }

  void finish(Slot& sl) {
    if (!sl.busy) return;
    sl.busy = false;  // a failed wait leaves nothing to wait for again
    check(vkWaitForFences(dev, 1, &sl.fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
  }
  void barrier(VkCommandBuffer c) {
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask =
        VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(c, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT |
                             VK_PIPELINE_STAGE_HOST_BIT,
                         0, 1, &mb, 0, nullptr, 0, nullptr);
  }

  VkPipeline pipeline(const std::string& name, uint32_t tm) {
    auto key = std::make_pair(name, tm);
    if (auto it = pipelines.find(key); it != pipelines.end()) return it->second;
    VkShaderModule& m = modules[name];
    if (m == VK_NULL_HANDLE) {
      const ShaderModule* found = nullptr;
      for (const ShaderModule& s : shader_modules())
        if (name == s.name) found = &s;
      if (found == nullptr) fail("internal: no embedded shader '{}'", name);
      VkShaderModuleCreateInfo si{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
      si.codeSize = found->size;
      si.pCode = reinterpret_cast<const uint32_t*>(found->code);
      check(vkCreateShaderModule(dev, &si, nullptr, &m), "vkCreateShaderModule");
    }
    VkSpecializationMapEntry entry{0, 0, sizeof(uint32_t)};
    VkSpecializationInfo spec{1, &entry, sizeof(uint32_t), &tm};
    VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
    ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    ci.stage.module = m;
    ci.stage.pName = "main";
    ci.stage.pSpecializationInfo = &spec;
    ci.layout = pipe_layout;
    VkPipeline p = VK_NULL_HANDLE;
    check(vkCreateComputePipelines(dev, VK_NULL_HANDLE, 1, &ci, nullptr, &p),
          "vkCreateComputePipelines");
    pipelines[key] = p;
    return p;
  }

  // The slot's descriptor pool, emptied, with room for `n` sets (its work has finished).
  void ensure_descriptor_sets(Slot& sl, uint32_t n) {
    if (n <= sl.pool_sets) {
      check(vkResetDescriptorPool(dev, sl.pool, 0), "vkResetDescriptorPool");
      return;
    }
    if (sl.pool) vkDestroyDescriptorPool(dev, sl.pool, nullptr);
    sl.pool = VK_NULL_HANDLE;
    sl.pool_sets = 0;
    const uint32_t sets = std::max<uint32_t>(n, 64);
    VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 6 * sets};
    VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    pi.maxSets = sets;
    pi.poolSizeCount = 1;
    pi.pPoolSizes = &size;
    check(vkCreateDescriptorPool(dev, &pi, nullptr, &sl.pool), "vkCreateDescriptorPool");
    sl.pool_sets = sets;
  }
};

Buffer::~Buffer() {
  if (owner == nullptr || owner->dev == VK_NULL_HANDLE) return;
  if (buffer) owner->vkDestroyBuffer(owner->dev, buffer, nullptr);
  if (memory) owner->vkFreeMemory(owner->dev, memory, nullptr);
}

Device::Device(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Device::~Device() = default;

std::unique_ptr<Device> Device::open(int index, bool staged) {
  Api& a = api();
  if (a.instance == VK_NULL_HANDLE) fail("no Vulkan device: {}", a.error);
  std::vector<VkPhysicalDevice> pds = physical_devices(a);
  if (index < 0 || index >= static_cast<int>(pds.size()))
    fail_setting("gpu", std::to_string(index), "no such Vulkan device (this machine has {}: 0..{})",
                 pds.size(), static_cast<int>(pds.size()) - 1);
  auto impl = std::make_unique<Impl>(a);
  Impl& d = *impl;
  d.pd = pds[static_cast<size_t>(index)];
  a.vkGetPhysicalDeviceProperties(d.pd, &d.props);
  a.vkGetPhysicalDeviceMemoryProperties(d.pd, &d.mem);
  uint32_t nf = 0;
  a.vkGetPhysicalDeviceQueueFamilyProperties(d.pd, &nf, nullptr);
  std::vector<VkQueueFamilyProperties> fams(nf);
  a.vkGetPhysicalDeviceQueueFamilyProperties(d.pd, &nf, fams.data());
  bool found = false;
  for (uint32_t i = 0; i < nf && !found; ++i) {
    if (fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
      d.family = i;
      found = true;
    }
  }
  if (!found) fail("Vulkan device {} ({}) has no compute queue", index, d.props.deviceName);
  DeviceInfo info = describe_device(a, d.pd, index);
  float prio = 1.0f;
  VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qi.queueFamilyIndex = d.family;
  qi.queueCount = 1;
  qi.pQueuePriorities = &prio;
  std::vector<const char*> exts;
  if (info.host_import && info.unified) {
    exts.push_back(VK_KHR_EXTERNAL_MEMORY_EXTENSION_NAME);
    exts.push_back(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
  }
  VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  di.queueCreateInfoCount = 1;
  di.pQueueCreateInfos = &qi;
  di.enabledExtensionCount = static_cast<uint32_t>(exts.size());
  di.ppEnabledExtensionNames = exts.data();
  check(a.vkCreateDevice(d.pd, &di, nullptr, &d.dev), "vkCreateDevice");
#define X(f)                                                         \
  d.f = reinterpret_cast<PFN_##f>(a.vkGetDeviceProcAddr(d.dev, #f)); \
  if (d.f == nullptr) fail("Vulkan device {} lacks {}", index, #f);
  DELTAFIN_VK_DEVICE_FNS(X)
#undef X
  if (!exts.empty()) {
    d.get_host_ptr_props = reinterpret_cast<PFN_vkGetMemoryHostPointerPropertiesEXT>(
        a.vkGetDeviceProcAddr(d.dev, "vkGetMemoryHostPointerPropertiesEXT"));
    VkPhysicalDeviceExternalMemoryHostPropertiesEXT hp{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT};
    VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    p2.pNext = &hp;
    a.vkGetPhysicalDeviceProperties2(d.pd, &p2);
    d.import_align = std::max<uint64_t>(hp.minImportedHostPointerAlignment, 1);
    d.import = d.get_host_ptr_props != nullptr;
  }
  if (staged) d.import = false;
  d.staged = staged;
  d.vkGetDeviceQueue(d.dev, d.family, 0, &d.queue);
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pi.queueFamilyIndex = d.family;
  check(d.vkCreateCommandPool(d.dev, &pi, nullptr, &d.cmd_pool), "vkCreateCommandPool");
  VkCommandBufferAllocateInfo ci{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ci.commandPool = d.cmd_pool;
  ci.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ci.commandBufferCount = 1;
  check(d.vkAllocateCommandBuffers(d.dev, &ci, &d.cmd), "vkAllocateCommandBuffers");
  VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  check(d.vkCreateFence(d.dev, &fi, nullptr, &d.fence), "vkCreateFence");
  for (Device::Impl::Slot& sl : d.slots) {
    check(d.vkAllocateCommandBuffers(d.dev, &ci, &sl.cmd), "vkAllocateCommandBuffers");
    check(d.vkCreateFence(d.dev, &fi, nullptr, &sl.fence), "vkCreateFence");
  }
  VkDescriptorSetLayoutBinding bindings[6];
  for (uint32_t i = 0; i < 6; ++i)
    bindings[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  VkDescriptorSetLayoutCreateInfo li{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  li.bindingCount = 6;
  li.pBindings = bindings;
  check(d.vkCreateDescriptorSetLayout(d.dev, &li, nullptr, &d.set_layout),
        "vkCreateDescriptorSetLayout");
  VkPushConstantRange pc{VK_SHADER_STAGE_COMPUTE_BIT, 0, 11 * sizeof(uint32_t)};
  VkPipelineLayoutCreateInfo pli{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  pli.setLayoutCount = 1;
  pli.pSetLayouts = &d.set_layout;
  pli.pushConstantRangeCount = 1;
  pli.pPushConstantRanges = &pc;
  check(d.vkCreatePipelineLayout(d.dev, &pli, nullptr, &d.pipe_layout), "vkCreatePipelineLayout");
  d.dummy = d.make_buffer(256, false, nullptr);
  std::unique_ptr<Device> dev(new Device(std::move(impl)));
  dev->info_ = info;
  dev->info_.host_import = d.import;
  for (int i = 0; i < 3; ++i) dev->max_groups_[i] = d.props.limits.maxComputeWorkGroupCount[i];
  return dev;
}

uint64_t Device::max_range() const {
  const uint64_t limit = impl_->props.limits.maxStorageBufferRange;
  return std::min<uint64_t>(limit, uint64_t{1} << 30) & ~uint64_t{255};
}

std::shared_ptr<Buffer> Device::alloc(uint64_t bytes, bool host_visible) {
  return impl_->make_buffer(std::max<uint64_t>(bytes, 16), host_visible, nullptr);
}

std::shared_ptr<Buffer> Device::import(const void* p, uint64_t bytes, uint64_t& offset) {
  Impl& d = *impl_;
  if (!d.import || p == nullptr || bytes == 0) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t base = start & ~(d.import_align - 1);
  const uint64_t end = (start + bytes + d.import_align - 1) & ~(d.import_align - 1);
  offset = start - base;
  if (end - base > max_range()) return nullptr;
  return d.make_buffer(end - base, false, reinterpret_cast<const void*>(base));
}

void Device::upload(Buffer& dst, uint64_t offset, const void* src, uint64_t bytes) {
  impl_->transfer(dst, offset, bytes, static_cast<const uint8_t*>(src), nullptr);
}

void Device::download(Buffer& src, uint64_t offset, void* dst, uint64_t bytes) {
  impl_->transfer(src, offset, bytes, nullptr, static_cast<uint8_t*>(dst));
}

uint64_t Device::submit(std::span<const Dispatch> dispatches) {
  Impl& d = *impl_;
  const uint64_t ticket = d.next_ticket;
  Impl::Slot& sl = d.slots[ticket % 2];
  d.finish(sl);  // the slot's previous work (two tickets ago)
  d.ensure_descriptor_sets(sl, static_cast<uint32_t>(std::max<size_t>(dispatches.size(), 1)));
  std::vector<VkDescriptorSet> sets(dispatches.size());
  std::vector<VkDescriptorSetLayout> layouts(dispatches.size(), d.set_layout);
  VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  ai.descriptorPool = sl.pool;
  ai.descriptorSetCount = static_cast<uint32_t>(sets.size());
  ai.pSetLayouts = layouts.data();
  check(d.vkAllocateDescriptorSets(d.dev, &ai, sets.data()), "vkAllocateDescriptorSets");
  std::vector<VkDescriptorBufferInfo> infos(dispatches.size() * 6);
  std::vector<VkWriteDescriptorSet> writes(dispatches.size() * 6);
  for (size_t i = 0; i < dispatches.size(); ++i) {
    for (size_t b = 0; b < 6; ++b) {
      Buffer* buf = dispatches[i].buffers[b] != nullptr ? dispatches[i].buffers[b] : d.dummy.get();
      const uint64_t off = dispatches[i].buffers[b] != nullptr ? dispatches[i].offsets[b] : 0;
      infos[i * 6 + b] = {buf->buffer, off, VK_WHOLE_SIZE};
      VkWriteDescriptorSet& w = writes[i * 6 + b];
      w = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
      w.dstSet = sets[i];
      w.dstBinding = static_cast<uint32_t>(b);
      w.descriptorCount = 1;
      w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      w.pBufferInfo = &infos[i * 6 + b];
    }
  }
  d.vkUpdateDescriptorSets(d.dev, static_cast<uint32_t>(writes.size()), writes.data(), 0, nullptr);
  std::vector<VkPipeline> pipes;
  for (const Dispatch& x : dispatches) pipes.push_back(d.pipeline(x.module, x.tm));
  d.begin(sl.cmd);
  for (size_t i = 0; i < dispatches.size(); ++i) {
    const Dispatch& x = dispatches[i];
    d.vkCmdBindPipeline(sl.cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipes[i]);
    d.vkCmdBindDescriptorSets(sl.cmd, VK_PIPELINE_BIND_POINT_COMPUTE, d.pipe_layout, 0, 1, &sets[i],
                              0, nullptr);
    d.vkCmdPushConstants(sl.cmd, d.pipe_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(x.push),
                         x.push);
    d.vkCmdDispatch(sl.cmd, x.groups[0], x.groups[1], x.groups[2]);
    d.barrier(sl.cmd);
  }
  d.submit(sl.cmd, sl.fence);
  sl.ticket = ticket;
  sl.busy = true;
  d.next_ticket = ticket + 1;
  return ticket;
}

void Device::wait(uint64_t ticket) {
  Impl::Slot& sl = impl_->slots[ticket % 2];
  if (sl.ticket == ticket) impl_->finish(sl);  // else it finished before its slot was reused
}

void Device::run(std::span<const Dispatch> dispatches) {
  if (dispatches.empty()) return;
  wait(submit(dispatches));
}

#endif  // DELTAFIN_HAVE_VULKAN

}  // namespace deltafin::gpu
