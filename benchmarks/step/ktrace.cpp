// ktrace: a kernel tracer the CUDA driver loads into any program (CUDA_INJECTION64_PATH), for
// benchmarks/step's per-kernel breakdown where Nsight Systems is not installed.
//
//   g++ -std=c++17 -O2 -shared -fPIC -I$CUDA/include ktrace.cpp -o libktrace.so -L$CUDA/lib64 -lcupti
//   CUDA_INJECTION64_PATH=$PWD/libktrace.so FORGE_KTRACE_OUT=/tmp/trace.%p.csv forge train ...
//
// At cuInit the driver calls InitializeInjection(), which turns on CUPTI's activity records for
// kernels (CONCURRENT_KERNEL: concurrency is kept, the kernels run as they would), memcpys and
// memsets. CUPTI timestamps each on the GPU and hands the records over in buffers; at exit the
// rest is flushed. One CSV line per record: start_ns,end_ns,device,stream,"name" (kernel names
// demangled; copies as "[memcpy HtoD]" and the like, "[memset]"). FORGE_KTRACE_OUT names the file
// ("%p" becomes the process id, for several ranks); default ktrace.%p.csv. The overhead is that
// of any CUPTI activity trace (Nsight Systems uses the same records): a few microseconds of host
// time per launch, none on the GPU.
//
// The record layouts are CUPTI's versioned structs; run.sh passes the newest the
// header declares (-DKTRACE_KERNEL_RECORD=CUpti_ActivityKernel10 etc.; the fields read here, kind,
// start, end, deviceId, streamId and name, exist in every version).
#include <cupti.h>
#include <cxxabi.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#ifndef KTRACE_KERNEL_RECORD
#define KTRACE_KERNEL_RECORD CUpti_ActivityKernel10
#endif
#ifndef KTRACE_MEMCPY_RECORD
#define KTRACE_MEMCPY_RECORD CUpti_ActivityMemcpy6
#endif
#ifndef KTRACE_MEMSET_RECORD
#define KTRACE_MEMSET_RECORD CUpti_ActivityMemset4
#endif

namespace {

std::FILE* g_out = nullptr;
std::mutex g_mu;
constexpr size_t kBufferBytes = 8u << 20;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "ktrace: %s failed: %s\n", what, msg ? msg : "?");
}

std::string demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = (status == 0 && d != nullptr) ? d : name;
  std::free(d);
  return s;
}

void write_record(uint64_t start, uint64_t end, uint32_t device, uint32_t stream, const std::string& name) {
  std::string quoted;
  quoted.reserve(name.size() + 2);
  for (char c : name) {
    if (c == '"') quoted += '"';  // CSV: a quote is doubled
    quoted += c;
  }
  std::fprintf(g_out, "%llu,%llu,%u,%u,\"%s\"\n", static_cast<unsigned long long>(start),
               static_cast<unsigned long long>(end), device, stream, quoted.c_str());
}

const char* copy_kind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "[memcpy HtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "[memcpy DtoH]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "[memcpy DtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "[memcpy PtoP]";
    default: return "[memcpy]";
  }
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
    while (g_out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
      switch (rec->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
          const auto* k = reinterpret_cast<const KTRACE_KERNEL_RECORD*>(rec);
          write_record(k->start, k->end, k->deviceId, k->streamId, demangle(k->name));
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const KTRACE_MEMCPY_RECORD*>(rec);
          write_record(m->start, m->end, m->deviceId, m->streamId, copy_kind(m->copyKind));
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* m = reinterpret_cast<const KTRACE_MEMSET_RECORD*>(rec);
          write_record(m->start, m->end, m->deviceId, m->streamId, "[memset]");
          break;
        }
        default: break;
      }
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS && dropped > 0)
      std::fprintf(stderr, "ktrace: CUPTI dropped %zu records\n", dropped);
  }
  std::free(buffer);
}

void at_exit() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_out) {
    std::fclose(g_out);
    g_out = nullptr;
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  static bool done = false;
  if (done) return 1;
  done = true;
  const char* pattern = std::getenv("FORGE_KTRACE_OUT");
  std::string path = pattern && *pattern ? pattern : "ktrace.%p.csv";
  const size_t at = path.find("%p");
  if (at != std::string::npos) path.replace(at, 2, std::to_string(static_cast<long long>(getpid())));
  g_out = std::fopen(path.c_str(), "w");
  if (!g_out) {
    std::fprintf(stderr, "ktrace: cannot write %s\n", path.c_str());
    return 1;  // the program runs on, untraced
  }
  std::fprintf(g_out, "start_ns,end_ns,device,stream,name\n");
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "cuptiActivityEnable(MEMCPY)");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "cuptiActivityEnable(MEMSET)");
  std::atexit(at_exit);
  std::fprintf(stderr, "ktrace: tracing kernels to %s\n", path.c_str());
  return 1;
}
