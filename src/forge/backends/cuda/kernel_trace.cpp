// Kernel records from CUPTI (contract in kernel_trace.h). CUPTI's functions are looked up with
// dlsym in the library CMake found beside the CUDA toolkit (FORGE_CUPTI_LIBRARY), else by name;
// the record layout is the newest the header declares (FORGE_CUPTI_KERNEL_RECORD), the one the
// library of the same toolkit writes. The fields read (kind, start, end, deviceId, streamId, name)
// exist in every version.
#include "forge/backends/cuda/kernel_trace.h"

#include <cuda_runtime.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#ifdef FORGE_WITH_CUPTI
#include <cupti.h>
#endif

namespace forge::cuda {

#ifdef FORGE_WITH_CUPTI
namespace {

constexpr size_t kBufferBytes = 8u << 20;

struct Api {
  void* lib = nullptr;
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*timestamp)(uint64_t*) = nullptr;
};

std::mutex g_mu;
std::vector<KernelRecord>* g_sink = nullptr;  // the started trace's records
Api g_api;

std::string demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = (status == 0 && d != nullptr) ? d : name;
  std::free(d);
  return s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    CUpti_Activity* rec = nullptr;
    while (g_sink && g_api.next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
      if (rec->kind != CUPTI_ACTIVITY_KIND_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
      const auto* k = reinterpret_cast<const FORGE_CUPTI_KERNEL_RECORD*>(rec);
      g_sink->push_back({demangle(k->name), k->start, k->end, k->deviceId, k->streamId});
    }
  }
  std::free(buffer);
}

bool load(std::string& note) {
  if (g_api.lib) return true;
  for (const char* name : {FORGE_CUPTI_LIBRARY, "libcupti.so", "libcupti.so.13", "libcupti.so.12"}) {
    if ((g_api.lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
  }
  if (!g_api.lib) {
    note = "CUPTI not found (libcupti.so of the CUDA toolkit): no kernels in the trace";
    return false;
  }
  auto sym = [](auto& f, const char* n) { f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(::dlsym(g_api.lib, n)); };
  sym(g_api.register_callbacks, "cuptiActivityRegisterCallbacks");
  sym(g_api.enable, "cuptiActivityEnable");
  sym(g_api.disable, "cuptiActivityDisable");
  sym(g_api.flush_all, "cuptiActivityFlushAll");
  sym(g_api.next_record, "cuptiActivityGetNextRecord");
  sym(g_api.timestamp, "cuptiGetTimestamp");
  if (!g_api.register_callbacks || !g_api.enable || !g_api.disable || !g_api.flush_all || !g_api.next_record ||
      !g_api.timestamp) {
    note = "CUPTI lacks the activity API: no kernels in the trace";
    return false;
  }
  return true;
}

}  // namespace

bool KernelTrace::start() {
  if (on_) return true;
  if (!load(note_)) return false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_sink) {
      note_ = "another kernel trace is running: no kernels in this one";
      return false;
    }
    g_sink = &records_;
  }
  if (g_api.register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      g_api.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_sink = nullptr;
    note_ = "CUPTI's activity records could not be turned on (a profiler may be collecting them): no kernels";
    return false;
  }
  on_ = true;
  return true;
}

void KernelTrace::stop() {
  if (!on_) return;
  cudaDeviceSynchronize();
  g_api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  g_api.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  g_api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mu);
  g_sink = nullptr;
  on_ = false;
}

uint64_t KernelTrace::now_ns() const {
  uint64_t t = 0;
  if (g_api.timestamp) g_api.timestamp(&t);
  return t;
}

#else  // a build without CUPTI's header

bool KernelTrace::start() {
  note_ = "this build has no CUPTI (its header was not found): no kernels in the trace";
  return false;
}
void KernelTrace::stop() {}
uint64_t KernelTrace::now_ns() const { return 0; }

#endif

KernelTrace::~KernelTrace() { stop(); }

}  // namespace forge::cuda
