// A user-level fiber on ucontext: its own mmap'd stack with a guard page below
// it (an overflow faults at once instead of corrupting a neighbour), entered
// with resume() from the OS thread's own context and left with suspend() or,
// for good, finish(). A fiber only ever runs on the OS thread that resumes it.
//
// Under AddressSanitizer every switch is announced with
// __sanitizer_{start,finish}_switch_fiber: ASan otherwise takes the fiber's
// stack for a wild region and reports false stack-buffer errors.
#pragma once

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <system_error>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EPCOMM_CPU_CUDA_ASAN 1
#endif

namespace epcomm::test::cpu_cuda {

class fiber {
 public:
  using entry_fn = void (*)();

  explicit fiber(std::size_t stack_bytes) {
    const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    stack_bytes_ = (stack_bytes + page - 1) / page * page;
    mapped_bytes_ = stack_bytes_ + page;
    mapping_ = mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapping_ == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "mmap");
    if (mprotect(mapping_, page, PROT_NONE) != 0) {
      const int error = errno;
      munmap(mapping_, mapped_bytes_);
      throw std::system_error(error, std::generic_category(), "mprotect");
    }
    stack_ = static_cast<char*>(mapping_) + page;
  }
  ~fiber() { munmap(mapping_, mapped_bytes_); }
  fiber(const fiber&) = delete;
  fiber& operator=(const fiber&) = delete;

  // Starts over at entry on the next resume(); the stack is reused. entry must
  // not return: it ends with finish().
  void reset(entry_fn entry) {
#ifdef EPCOMM_CPU_CUDA_ASAN
    // A fiber dropped mid-kernel left its frames' redzones poisoned.
    __asan_unpoison_memory_region(stack_, stack_bytes_);
#endif
    if (getcontext(&context_) != 0)
      throw std::system_error(errno, std::generic_category(), "getcontext");
    context_.uc_stack.ss_sp = stack_;
    context_.uc_stack.ss_size = stack_bytes_;
    context_.uc_link = nullptr;
    makecontext(&context_, entry, 0);
  }

  // From the OS thread's context: runs the fiber until it suspends or finishes.
  void resume() {
#ifdef EPCOMM_CPU_CUDA_ASAN
    void* fake_stack = nullptr;
    __sanitizer_start_switch_fiber(&fake_stack, stack_, stack_bytes_);
#endif
    swapcontext(&caller_, &context_);
#ifdef EPCOMM_CPU_CUDA_ASAN
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
  }

  // The first thing entry does: completes the switch that started the fiber.
  void entered() {
#ifdef EPCOMM_CPU_CUDA_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &caller_stack_, &caller_stack_bytes_);
#endif
  }

  // From inside the fiber: back to whoever resumed it, until the next resume().
  void suspend() {
#ifdef EPCOMM_CPU_CUDA_ASAN
    __sanitizer_start_switch_fiber(&fake_stack_, caller_stack_, caller_stack_bytes_);
#endif
    swapcontext(&context_, &caller_);
#ifdef EPCOMM_CPU_CUDA_ASAN
    __sanitizer_finish_switch_fiber(fake_stack_, &caller_stack_, &caller_stack_bytes_);
#endif
  }

  // From inside the fiber, with nothing left on its stack to unwind: back to
  // whoever resumed it, for good (until reset()).
  [[noreturn]] void finish() {
#ifdef EPCOMM_CPU_CUDA_ASAN
    __sanitizer_start_switch_fiber(nullptr, caller_stack_, caller_stack_bytes_);
#endif
    setcontext(&caller_);
    __builtin_unreachable();
  }

 private:
  void* mapping_ = nullptr;
  std::size_t mapped_bytes_ = 0;
  char* stack_ = nullptr;
  std::size_t stack_bytes_ = 0;
  ucontext_t context_{};
  ucontext_t caller_{};
#ifdef EPCOMM_CPU_CUDA_ASAN
  void* fake_stack_ = nullptr;
  const void* caller_stack_ = nullptr;
  std::size_t caller_stack_bytes_ = 0;
#endif
};

}  // namespace epcomm::test::cpu_cuda
