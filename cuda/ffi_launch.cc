// XLA FFI handler that launches one generated kernel on XLA's stream.
//
// Thin by design: Python generates and compiles the kernel and decides the launch shape; this
// file binds buffers, loads the kernel image once per CUDA context (thread-safe cache), zeroes
// the outputs that accumulate, caps the grid of a filling launch at the blocks the device holds
// at once (the driver's occupancy), and launches. The CUDA driver is loaded lazily with dlopen, so
// the extension builds without a CUDA toolkit and imports on machines without a GPU.
//
// The kernel is loaded in XLA's initialize stage, before the executable enqueues any work, not
// when it launches: on several GPUs a device's stream may by then run a collective (NCCL) kernel
// that waits for the other devices, and loading a module (which allocates device memory) into
// that context can wait for it, while another device's thread waits for the cache's lock before
// it reaches the collective. A launch across two H100s hung that way at its first call (jax.jit
// over edges split across them, float64 kernels loaded after the float32 ones had run).
//
// XLA may record the handler's work into a CUDA graph (a command buffer) and replay it: Python
// registers the target as compatible (jax_cgtp/gpu/cuda_lowering.py, Settings.command_buffers). For a given call
// the handler enqueues the same memsets and launch on the stream XLA passes, into XLA's buffers,
// and never synchronises or queries the stream; the module load happens in the initialize stage,
// outside any capture.
//
// Kernel signature expected by the launcher (jax_cgtp/gpu/signature.py builds it once per launch,
// and both the code generator and the lowering read it): one pointer per operand buffer, then one
// per result buffer, then one `long long` per entry of the `scalars` attribute. Every parameter
// is 8 bytes. Where the driver can say how many parameters a kernel takes (cuFuncGetParamInfo),
// a launch that binds another count fails with an error naming both counts, instead of reading
// out of bounds.

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "nanobind/nanobind.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
namespace nb = nanobind;

namespace {

// The few driver API types and entry points we use, declared here instead of taken from
// cuda.h so that no CUDA toolkit is needed at build time.
using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUdeviceptr = unsigned long long;
constexpr int kFuncAttributeMaxDynamicSharedSize = 8;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int kDeviceAttributeMultiprocessorCount = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr int64_t kKeep = 2;  // a zero_outputs flag: the output aliases an argument (cuda_lowering.KEEP)

struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxGetDevice)(CUdevice*);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int, size_t);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void**, void**);
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuFuncGetParamInfo)(CUfunction, size_t, size_t*, size_t*);  // optional (CUDA 12.4+)
  std::string load_error;
};

template <typename F>
bool Resolve(void* library, const char* name, F*& slot) {
  slot = reinterpret_cast<F*>(dlsym(library, name));
  return slot != nullptr;
}

const Driver& GetDriver() {
  static const Driver driver = [] {
    Driver d{};
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      d.load_error = std::string("cannot load the CUDA driver libcuda.so.1: ") + dlerror();
      return d;
    }
    bool ok = Resolve(library, "cuInit", d.cuInit) &&
              Resolve(library, "cuDeviceGet", d.cuDeviceGet) &&
              Resolve(library, "cuDeviceGetAttribute", d.cuDeviceGetAttribute) &&
              Resolve(library, "cuStreamGetCtx", d.cuStreamGetCtx) &&
              Resolve(library, "cuCtxGetCurrent", d.cuCtxGetCurrent) &&
              Resolve(library, "cuCtxSetCurrent", d.cuCtxSetCurrent) &&
              Resolve(library, "cuCtxGetDevice", d.cuCtxGetDevice) &&
              Resolve(library, "cuModuleLoadData", d.cuModuleLoadData) &&
              Resolve(library, "cuModuleGetFunction", d.cuModuleGetFunction) &&
              Resolve(library, "cuFuncSetAttribute", d.cuFuncSetAttribute) &&
              Resolve(library, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                      d.cuOccupancyMaxActiveBlocksPerMultiprocessor) &&
              Resolve(library, "cuLaunchKernel", d.cuLaunchKernel) &&
              Resolve(library, "cuMemsetD8Async", d.cuMemsetD8Async) &&
              Resolve(library, "cuGetErrorString", d.cuGetErrorString);
    Resolve(library, "cuFuncGetParamInfo", d.cuFuncGetParamInfo);
    if (!ok) {
      d.load_error = "libcuda.so.1 lacks a driver API entry point jax_cgtp needs";
    } else if (d.cuInit(0) != 0) {
      d.load_error = "cuInit failed";
    }
    return d;
  }();
  return driver;
}

ffi::Error DriverError(const Driver& d, CUresult status, const char* what) {
  const char* message = "unknown error";
  if (d.cuGetErrorString != nullptr) d.cuGetErrorString(status, &message);
  return ffi::Error::Internal(std::string("jax_cgtp: ") + what + " failed: " + message);
}

// A loaded kernel, the blocks of its launch shape that the device holds at once, and the number
// of parameters it takes (-1 where the driver cannot say).
struct LoadedKernel {
  CUfunction function;
  int64_t resident_blocks;
  int64_t parameters;
};

// The number of parameters of `function`: the first index the driver has no parameter at.
int64_t ParameterCount(const Driver& d, CUfunction function) {
  if (d.cuFuncGetParamInfo == nullptr) return -1;
  size_t offset = 0, size = 0;
  int64_t count = 0;
  while (d.cuFuncGetParamInfo(function, static_cast<size_t>(count), &offset, &size) == 0) ++count;
  return count;
}

// Loaded kernels, keyed by (context, image id, kernel name). The image id is a hash of the image
// computed once in Python, so a launch never compares or copies the image itself. An image's
// source fixes its block and shared memory, so its resident blocks are computed once too.
struct KernelCache {
  std::mutex mutex;
  std::map<std::tuple<CUcontext, int64_t, std::string>, LoadedKernel> kernels;
};

KernelCache& GetCache() {
  static KernelCache* cache = new KernelCache();  // never destroyed: outlives XLA's threads
  return *cache;
}

ffi::ErrorOr<LoadedKernel> LoadKernel(const Driver& d, CUcontext context,
                                      ffi::Span<const uint8_t> image, int64_t image_id,
                                      std::string_view name, int64_t block, int64_t shared_bytes) {
  KernelCache& cache = GetCache();
  auto key = std::make_tuple(context, image_id, std::string(name));
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto found = cache.kernels.find(key);
    if (found != cache.kernels.end()) return found->second;
  }
  // Loaded without the cache's lock: a load can wait for its device, and the other devices'
  // threads must still find their kernels meanwhile. Two threads that load the same kernel into
  // the same context at once both load it; the first to insert it wins (the other module stays
  // loaded, unused).
  std::string bytes(image.begin(), image.end());
  CUmodule module = nullptr;
  if (CUresult s = d.cuModuleLoadData(&module, bytes.data()); s != 0) {
    return ffi::Unexpected(DriverError(d, s, "cuModuleLoadData"));
  }
  CUfunction function = nullptr;
  if (CUresult s = d.cuModuleGetFunction(&function, module, std::get<2>(key).c_str()); s != 0) {
    return ffi::Unexpected(DriverError(d, s, "cuModuleGetFunction"));
  }
  if (shared_bytes > 48 * 1024) {
    CUresult s = d.cuFuncSetAttribute(function, kFuncAttributeMaxDynamicSharedSize,
                                      static_cast<int>(shared_bytes));
    if (s != 0) return ffi::Unexpected(DriverError(d, s, "cuFuncSetAttribute"));
  }
  int per_sm = 0, sms = 0;
  CUdevice device = 0;
  if (CUresult s = d.cuOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, function, static_cast<int>(block), static_cast<size_t>(shared_bytes));
      s != 0) {
    return ffi::Unexpected(DriverError(d, s, "cuOccupancyMaxActiveBlocksPerMultiprocessor"));
  }
  if (CUresult s = d.cuCtxGetDevice(&device); s != 0) return ffi::Unexpected(DriverError(d, s, "cuCtxGetDevice"));
  if (CUresult s = d.cuDeviceGetAttribute(&sms, kDeviceAttributeMultiprocessorCount, device); s != 0) {
    return ffi::Unexpected(DriverError(d, s, "cuDeviceGetAttribute"));
  }
  LoadedKernel loaded{function, static_cast<int64_t>(per_sm) * sms, ParameterCount(d, function)};
  std::lock_guard<std::mutex> lock(cache.mutex);
  return cache.kernels.emplace(std::move(key), loaded).first->second;
}

// The driver, with the context of `stream` made current (the context the kernel is cached for).
ffi::ErrorOr<CUcontext> StreamContext(const Driver& d, CUstream stream) {
  if (!d.load_error.empty()) return ffi::Unexpected(ffi::Error::Internal("jax_cgtp: " + d.load_error));
  CUcontext context = nullptr;
  if (CUresult s = d.cuStreamGetCtx(stream, &context); s != 0) {
    return ffi::Unexpected(DriverError(d, s, "cuStreamGetCtx"));
  }
  CUcontext current = nullptr;
  d.cuCtxGetCurrent(&current);
  if (current != context) {
    if (CUresult s = d.cuCtxSetCurrent(context); s != 0) return ffi::Unexpected(DriverError(d, s, "cuCtxSetCurrent"));
  }
  return context;
}

// Initialize stage: load the kernel into the stream's context (see the top of this file).
ffi::Error Load(CUstream stream, ffi::RemainingArgs, ffi::RemainingRets, ffi::Span<const uint8_t> image,
                int64_t image_id, std::string_view kernel, int64_t grid, int64_t block, int64_t shared_bytes,
                ffi::Span<const int64_t>, ffi::Span<const int64_t>, int64_t, int64_t) {
  if (grid == 0) return ffi::Error::Success();
  const Driver& d = GetDriver();
  auto context = StreamContext(d, stream);
  if (context.has_error()) return context.error();
  auto loaded = LoadKernel(d, *context, image, image_id, kernel, block, shared_bytes);
  return loaded.has_error() ? loaded.error() : ffi::Error::Success();
}

// Execute stage: zero or poison the outputs, launch.
ffi::Error Launch(CUstream stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                  ffi::Span<const uint8_t> image, int64_t image_id, std::string_view kernel,
                  int64_t grid, int64_t block, int64_t shared_bytes,
                  ffi::Span<const int64_t> scalars, ffi::Span<const int64_t> zero_outputs,
                  int64_t poison, int64_t fill) {
  const Driver& d = GetDriver();
  auto stream_context = StreamContext(d, stream);
  if (stream_context.has_error()) return stream_context.error();
  CUcontext context = *stream_context;

  std::vector<void*> pointers;
  pointers.reserve(args.size() + rets.size());
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    pointers.push_back(buffer->untyped_data());
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    pointers.push_back((*buffer)->untyped_data());
    // Accumulated outputs start from zero (flag 1); with `poison`, the others start as NaN (all
    // bits set), so that a test sees any element the kernel fails to write; but an output that
    // aliases an argument (flag 2, kKeep) adds to what that argument holds, and starts as it is.
    int64_t flag = i < zero_outputs.size() ? zero_outputs[i] : 0;
    bool zero = flag == 1;
    if (flag != kKeep && (zero || poison != 0) && (*buffer)->size_bytes() > 0) {
      CUresult s = d.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>((*buffer)->untyped_data()),
                                     zero ? 0 : 0xff, (*buffer)->size_bytes(), stream);
      if (s != 0) return DriverError(d, s, "cuMemsetD8Async");
    }
  }
  if (grid == 0) return ffi::Error::Success();

  auto loaded = LoadKernel(d, context, image, image_id, kernel, block, shared_bytes);
  if (loaded.has_error()) return loaded.error();
  // A filling launch runs one wave: its kernel spreads the edges over the warps it gets.
  if (fill != 0 && loaded->resident_blocks > 0 && grid > loaded->resident_blocks) grid = loaded->resident_blocks;

  const int64_t bound = static_cast<int64_t>(pointers.size() + scalars.size());
  if (loaded->parameters >= 0 && loaded->parameters != bound) {
    return ffi::Error::InvalidArgument(
        "jax_cgtp: kernel " + std::string(kernel) + " takes " + std::to_string(loaded->parameters) +
        " parameters but the launch binds " + std::to_string(bound) + " (" + std::to_string(args.size()) +
        " operands, " + std::to_string(rets.size()) + " results, " + std::to_string(scalars.size()) + " scalars)");
  }
  std::vector<long long> values(scalars.begin(), scalars.end());
  std::vector<void*> params;
  params.reserve(pointers.size() + values.size());
  for (void*& pointer : pointers) params.push_back(&pointer);
  for (long long& value : values) params.push_back(&value);
  CUresult s = d.cuLaunchKernel(loaded->function, static_cast<unsigned>(grid), 1, 1,
                                static_cast<unsigned>(block), 1, 1,
                                static_cast<unsigned>(shared_bytes), stream, params.data(), nullptr);
  if (s != 0) return DriverError(d, s, "cuLaunchKernel");
  return ffi::Error::Success();
}

}  // namespace

// Both stages bind the same call frame: the buffers, then the launch's attributes.
template <ffi::ExecutionStage stage>
auto LaunchBinding() {
  return ffi::Ffi::Bind<stage>()
      .template Ctx<ffi::PlatformStream<CUstream>>()
      .RemainingArgs()
      .RemainingRets()
      .template Attr<ffi::Span<const uint8_t>>("image")
      .template Attr<int64_t>("image_id")
      .template Attr<std::string_view>("kernel")
      .template Attr<int64_t>("grid")
      .template Attr<int64_t>("block")
      .template Attr<int64_t>("shared_bytes")
      .template Attr<ffi::Span<const int64_t>>("scalars")
      .template Attr<ffi::Span<const int64_t>>("zero_outputs")
      .template Attr<int64_t>("poison")
      .template Attr<int64_t>("fill");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxCgtpLoad, Load, LaunchBinding<ffi::ExecutionStage::kInitialize>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxCgtpLaunch, Launch, LaunchBinding<ffi::ExecutionStage::kExecute>());

// Compute capability of CUDA device `ordinal` as major * 10 + minor (e.g. 90), for NVRTC's target.
int ComputeCapability(int ordinal) {
  const Driver& d = GetDriver();
  if (!d.load_error.empty()) throw std::runtime_error("jax_cgtp: " + d.load_error);
  CUdevice device = 0;
  int major = 0, minor = 0;
  if (d.cuDeviceGet(&device, ordinal) != 0 ||
      d.cuDeviceGetAttribute(&major, 75, device) != 0 ||  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
      d.cuDeviceGetAttribute(&minor, 76, device) != 0) {  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
    throw std::runtime_error("jax_cgtp: cannot read the compute capability of CUDA device " +
                             std::to_string(ordinal));
  }
  return major * 10 + minor;
}

NB_MODULE(_ffi, m) {
  m.doc() = "XLA FFI handlers of jax_cgtp (CUDA platform).";
  m.def("compute_capability", &ComputeCapability, nb::arg("ordinal") = 0);
  m.def("registrations", []() {
    nb::dict stages, targets;
    stages["initialize"] = nb::capsule(reinterpret_cast<void*>(JaxCgtpLoad));
    stages["execute"] = nb::capsule(reinterpret_cast<void*>(JaxCgtpLaunch));
    targets["jax_cgtp_launch"] = stages;
    return targets;
  });
}
