// The CUDA runtime on the CPU (runtime.hpp says what it models), and the
// three device_sync.cuh helpers kernels.hpp routes here. Link it instead of
// libcudart.
#include "support/cpu_cuda/runtime.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/cpu_cuda/device_api.hpp"

// ---- the kernels' side (kernels.hpp) -----------------------------------------

namespace epcomm::cuda::device {

std::uint64_t host_load_acquire(const std::uint64_t* p) {
  test::cpu_cuda::yield();
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

void host_add_release(std::uint64_t* p, std::uint64_t n) {
  __atomic_fetch_add(p, n, __ATOMIC_RELEASE);
}

std::uint64_t host_now_ns() { return test::cpu_cuda::globaltimer_ns(); }
}  // namespace epcomm::cuda::device

// ---- streams, graphs and the context's state -----------------------------------

struct CUgraph_st {
  std::vector<std::function<void()>> ops;
};

struct CUgraphExec_st {
  std::vector<std::function<void()>> ops;
};

// A created stream runs its operations in order on a thread of its own, so
// that streams overlap with each other and with the host as on a GPU, and an
// order between them exists only where an event makes one.
struct CUstream_st {
  explicit CUstream_st(bool blocking);
  ~CUstream_st();
  void push(std::function<void()> op);
  // Until the first `position` operations have run.
  void wait_until(std::uint64_t position);
  bool reached(std::uint64_t position);
  std::uint64_t position();  // operations enqueued so far

  bool blocking;  // ordered after the legacy default stream's work (and it after ours)
  CUgraph_st* capture = nullptr;  // while captured: where its work goes

 private:
  void run();
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  std::uint64_t enqueued_ = 0;
  std::uint64_t done_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

// Where and when an event was last recorded: complete once `stream` has run
// `position` operations; never recorded (or on the default stream, which
// runs in place): complete.
struct CUevent_st {
  CUstream_st* stream = nullptr;
  std::uint64_t position = 0;
  CUgraph_st* capture = nullptr;       // recorded into this capture,
  cudaStream_t captured_in = nullptr;  // from this stream
};

CUstream_st::CUstream_st(bool b) : blocking(b), worker_([this] { run(); }) {}

CUstream_st::~CUstream_st() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

void CUstream_st::push(std::function<void()> op) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(op));
    ++enqueued_;
  }
  changed_.notify_all();
}

void CUstream_st::wait_until(std::uint64_t position) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return done_ >= position; });
}

bool CUstream_st::reached(std::uint64_t position) {
  std::lock_guard lock(mutex_);
  return done_ >= position;
}

std::uint64_t CUstream_st::position() {
  std::lock_guard lock(mutex_);
  return enqueued_;
}

// Drains the queue before it stops: destroying a stream lets its work finish.
void CUstream_st::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    std::function<void()> op = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    op();
    lock.lock();
    ++done_;
    changed_.notify_all();
  }
}

namespace epcomm::test::cpu_cuda {
namespace {

// A kernel fault breaks the context for good, as a device exception does.
std::atomic<cudaError_t> sticky{cudaSuccess};
thread_local cudaError_t last_launch = cudaSuccess;
std::atomic<std::uint64_t> launches{0};

// The legacy default stream (null) runs each operation in place, once the
// blocking streams' earlier work has run; it can be captured like any other.
struct default_stream_state {
  CUgraph_st* capture = nullptr;
};
default_stream_state default_stream;

std::mutex streams_mutex;
std::set<CUstream_st*> streams;  // created and not destroyed

CUgraph_st*& capture_of(cudaStream_t s) {
  return s == nullptr ? default_stream.capture : s->capture;
}

// Waits for what every created stream (only the blocking ones: `all` false)
// has enqueued so far.
void drain(bool all) {
  std::vector<std::pair<CUstream_st*, std::uint64_t>> marks;
  {
    std::lock_guard lock(streams_mutex);
    for (CUstream_st* s : streams)
      if (all || s->blocking) marks.emplace_back(s, s->position());
  }
  for (auto [s, position] : marks) s->wait_until(position);
}

cudaError_t status() { return sticky.load(); }

std::uint64_t env_number(const char* name, std::uint64_t fallback) {
  const char* s = std::getenv(name);
  return s == nullptr || *s == '\0' ? fallback : std::strtoull(s, nullptr, 10);
}

// Device memory: a memfd per allocation, so that another process can map it
// (cudaIpcOpenMemHandle) through /proc/<pid>/fd.
struct allocation {
  int fd;
  std::size_t bytes;
};

struct ipc_handle {
  std::int32_t pid;
  std::int32_t fd;
  std::uint64_t bytes;
};
static_assert(sizeof(ipc_handle) <= sizeof(cudaIpcMemHandle_t));

std::mutex memory_mutex;
std::map<const void*, allocation> device_allocations;
std::map<const void*, std::size_t> peer_mappings;

std::size_t page_rounded(std::size_t bytes) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return (std::max<std::size_t>(bytes, 1) + page - 1) / page * page;
}

}  // namespace

const device_settings& settings() {
  static const device_settings s{
      static_cast<unsigned>(std::max<std::uint64_t>(env_number("EPCOMM_CPU_CUDA_SMS", 2), 1)),
      env_number("EPCOMM_CPU_CUDA_SEED", 1),
      std::chrono::milliseconds(env_number("EPCOMM_CPU_CUDA_DEADLINE_MS", 120'000))};
  return s;
}

void enqueue(cudaStream_t stream, std::function<void()> op) {
  if (CUgraph_st* graph = capture_of(stream)) {
    graph->ops.push_back(std::move(op));
  } else if (stream != nullptr) {
    stream->push(std::move(op));
  } else {
    drain(false);
    op();
  }
}

void set_launch_error(cudaError_t e) { last_launch = e; }

void run_grid(const char* kernel, const std::function<void(const launch_options&)>& grid) {
  if (status() != cudaSuccess) return;  // a broken context runs nothing
  launch_options opt;
  opt.sms = settings().sms;
  opt.deadline = settings().deadline;
  opt.seed = settings().seed + launches.fetch_add(1);
  try {
    grid(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n  in kernel %s, pid %d, schedule seed %llu\n", e.what(), kernel,
                 static_cast<int>(getpid()), static_cast<unsigned long long>(opt.seed));
    sticky.store(cudaErrorLaunchFailure);
  }
}

}  // namespace epcomm::test::cpu_cuda

// ---- the runtime API -------------------------------------------------------------

namespace cc = epcomm::test::cpu_cuda;

extern "C" {

cudaError_t cudaGetLastError() {
  const cudaError_t e = cc::last_launch;
  cc::last_launch = cudaSuccess;
  return e != cudaSuccess ? e : cc::status();
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorIllegalState:
      return "cudaErrorIllegalState";
    case cudaErrorMapBufferObjectFailed:
      return "cudaErrorMapBufferObjectFailed";
    case cudaErrorStreamCaptureIsolation:
      return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureUnjoined:
      return "cudaErrorStreamCaptureUnjoined";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaErrorLaunchFailure:
      return "unspecified launch failure (a kernel faulted on the CPU execution layer; its "
             "fault is on stderr)";
    case cudaErrorMapBufferObjectFailed:
      return "the peer's allocation could not be mapped";
    default:
      return cudaGetErrorName(e);
  }
}

// ---- device ----

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cc::status() : cudaErrorInvalidDevice;
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cc::status();
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = static_cast<int>(cc::settings().sms);
      return cc::status();
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(cc::max_dynamic_shared_bytes);
      return cc::status();
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t cudaDeviceSynchronize() {
  cc::drain(true);
  return cc::status();
}

cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize &&
      (value < 0 || static_cast<std::size_t>(value) > cc::max_dynamic_shared_bytes))
    return cudaErrorInvalidValue;
  return cc::status();
}

// No driver here: the nvlink_ipc transport's fabric path reports it.
cudaError_t cudaGetDriverEntryPointByVersion(const char*, void** function, unsigned int,
                                             unsigned long long,
                                             cudaDriverEntryPointQueryResult* result) {
  *function = nullptr;
  if (result != nullptr) *result = cudaDriverEntryPointSymbolNotFound;
  return cudaErrorNotSupported;
}

// ---- memory ----

// Like CUDA's, fresh device memory holds whatever it held before: 0xA5 bytes
// here, so a kernel that reads what nobody wrote sees garbage, not zeros.
cudaError_t cudaMalloc(void** pointer, size_t bytes) {
  *pointer = nullptr;
  const std::size_t length = cc::page_rounded(bytes);
  const int fd = memfd_create("epcomm-cpu-cuda", MFD_CLOEXEC);
  if (fd < 0) return cudaErrorMemoryAllocation;
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(length)) == 0)
    p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return cudaErrorMemoryAllocation;
  }
  std::memset(p, 0xA5, length);
  std::lock_guard lock(cc::memory_mutex);
  cc::device_allocations[p] = {fd, length};
  *pointer = p;
  return cc::status();
}

cudaError_t cudaFree(void* pointer) {
  if (pointer == nullptr) return cc::status();
  std::lock_guard lock(cc::memory_mutex);
  const auto it = cc::device_allocations.find(pointer);
  if (it == cc::device_allocations.end()) return cudaErrorInvalidValue;
  munmap(pointer, it->second.bytes);
  close(it->second.fd);
  cc::device_allocations.erase(it);
  return cc::status();
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* pointer) {
  std::lock_guard lock(cc::memory_mutex);
  const auto it = cc::device_allocations.find(pointer);
  if (it == cc::device_allocations.end()) return cudaErrorInvalidValue;
  std::memset(handle, 0, sizeof *handle);
  const cc::ipc_handle h{static_cast<std::int32_t>(getpid()), it->second.fd, it->second.bytes};
  std::memcpy(handle, &h, sizeof h);
  return cc::status();
}

cudaError_t cudaIpcOpenMemHandle(void** pointer, cudaIpcMemHandle_t handle, unsigned int) {
  cc::ipc_handle h{};
  std::memcpy(&h, &handle, sizeof h);
  *pointer = nullptr;
  if (h.pid == getpid()) return cudaErrorInvalidValue;  // CUDA refuses a process's own handle
  const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return cudaErrorMapBufferObjectFailed;
  void* p = mmap(nullptr, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return cudaErrorMapBufferObjectFailed;
  std::lock_guard lock(cc::memory_mutex);
  cc::peer_mappings[p] = h.bytes;
  *pointer = p;
  return cc::status();
}

cudaError_t cudaIpcCloseMemHandle(void* pointer) {
  std::lock_guard lock(cc::memory_mutex);
  const auto it = cc::peer_mappings.find(pointer);
  if (it == cc::peer_mappings.end()) return cudaErrorInvalidValue;
  munmap(pointer, it->second);
  cc::peer_mappings.erase(it);
  return cc::status();
}

// Pinned host memory is host memory.
cudaError_t cudaMallocHost(void** pointer, size_t bytes) {
  *pointer = std::aligned_alloc(256, cc::page_rounded(bytes));
  return *pointer == nullptr ? cudaErrorMemoryAllocation : cc::status();
}

cudaError_t cudaFreeHost(void* pointer) {
  std::free(pointer);
  return cc::status();
}

// Mapped pinned memory (the GPU-fed proxy's rings, counters and host-memory
// buffers) is host memory too, at the same address on the "device".
cudaError_t cudaHostAlloc(void** pointer, size_t bytes, unsigned int) {
  return cudaMallocHost(pointer, bytes);
}

cudaError_t cudaHostRegister(void*, size_t, unsigned int) { return cc::status(); }

cudaError_t cudaHostUnregister(void*) { return cc::status(); }

cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned int) {
  *device = host;
  return cc::status();
}

// The "device" is on no PCIe bus: the libfabric transport then chooses its
// NIC as for host memory.
cudaError_t cudaDeviceGetPCIBusId(char*, int, int) { return cudaErrorNotSupported; }

// The synchronous copies run on the legacy default stream.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  cc::drain(false);
  if (cc::status() != cudaSuccess) return cc::status();
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t stream) {
  cc::enqueue(stream, [=] {
    if (cc::status() == cudaSuccess) std::memcpy(dst, src, bytes);
  });
  return cc::status();
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  cc::drain(false);
  if (cc::status() != cudaSuccess) return cc::status();
  std::memset(dst, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  cc::enqueue(stream, [=] {
    if (cc::status() == cudaSuccess) std::memset(dst, value, bytes);
  });
  return cc::status();
}

// ---- streams, events and graphs ----

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  *stream = new CUstream_st((flags & cudaStreamNonBlocking) == 0);
  std::lock_guard lock(cc::streams_mutex);
  cc::streams.insert(*stream);
  return cc::status();
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr) return cudaErrorInvalidValue;
  {
    std::lock_guard lock(cc::streams_mutex);
    cc::streams.erase(stream);
  }
  delete stream;
  return cc::status();
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (stream == nullptr)
    cc::drain(false);
  else
    stream->wait_until(stream->position());
  return cc::status();
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (stream != nullptr && !stream->reached(stream->position())) return cudaErrorNotReady;
  return cc::status();
}

// The host function runs in the stream's order, on its thread (as CUDA runs
// it on a thread of its own): it may block, which holds the stream.
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* data) {
  cc::enqueue(stream, [=] { fn(data); });
  return cc::status();
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = new CUevent_st;
  return cc::status();
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return cudaErrorInvalidValue;
  *event = {};
  if (CUgraph_st* graph = cc::capture_of(stream)) {
    event->capture = graph;
    event->captured_in = stream;
  } else if (stream != nullptr) {
    event->stream = stream;
    event->position = stream->position();
  } else {
    cc::drain(false);  // the default stream's work so far: the blocking streams'
  }
  return cc::status();
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event->stream != nullptr) event->stream->wait_until(event->position);
  return cc::status();
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event->stream != nullptr && !event->stream->reached(event->position))
    return cudaErrorNotReady;
  return cc::status();
}

// A wait on an event recorded into a capture joins the waiting stream to it
// (CUDA's fork); the origin waiting on a joined stream's event rejoins it.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  CUgraph_st*& capture = cc::capture_of(stream);
  if (event->capture != nullptr) {
    if (capture == nullptr) {
      capture = event->capture;
    } else if (capture != event->capture) {
      return cudaErrorStreamCaptureIsolation;
    } else if (event->captured_in != stream) {
      cc::capture_of(event->captured_in) = nullptr;
    }
    return cc::status();
  }
  if (capture != nullptr) return cudaErrorStreamCaptureIsolation;  // an event outside the capture
  CUstream_st* source = event->stream;
  const std::uint64_t position = event->position;
  if (source != nullptr) cc::enqueue(stream, [=] { source->wait_until(position); });
  return cc::status();
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  CUgraph_st*& capture = cc::capture_of(stream);
  if (capture != nullptr) return cudaErrorIllegalState;
  capture = new CUgraph_st;
  return cc::status();
}

// Every stream the capture forked into must have rejoined it.
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  CUgraph_st*& capture = cc::capture_of(stream);
  if (capture == nullptr) return cudaErrorIllegalState;
  bool unjoined = false;
  {
    std::lock_guard lock(cc::streams_mutex);
    for (CUstream_st* s : cc::streams)
      if (s != stream && s->capture == capture) {
        s->capture = nullptr;
        unjoined = true;
      }
  }
  *graph = capture;
  capture = nullptr;
  if (unjoined) {
    delete *graph;
    *graph = nullptr;
    return cudaErrorStreamCaptureUnjoined;
  }
  return cc::status();
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  *status = cc::capture_of(stream) != nullptr ? cudaStreamCaptureStatusActive
                                              : cudaStreamCaptureStatusNone;
  return cc::status();
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = new CUgraphExec_st{graph->ops};
  return cc::status();
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  for (const auto& op : exec->ops) cc::enqueue(stream, op);
  return cc::status();
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

}  // extern "C"
