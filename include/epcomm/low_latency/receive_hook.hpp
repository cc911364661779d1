// The receive phase of a low-latency call whose send phase has run, handed
// back to the caller so that it can overlap compute with communication:
// calling the hook runs the phase (the host engine) or launches it (the
// device buffer). Only the buffer makes hooks; the arguments name the call
// (its parity, its number there and, on the device, the stream).
#pragma once

#include <tuple>

namespace epcomm {

template <class Buffer, class Result, class... Args>
class receive_hook {
 public:
  Result operator()() {
    return std::apply([this](Args... args) { return (buf_->*receive_)(args...); }, args_);
  }

 private:
  friend Buffer;
  using receive_fn = Result (Buffer::*)(Args...);
  receive_hook(Buffer* buf, receive_fn receive, Args... args)
      : buf_(buf), receive_(receive), args_(args...) {}

  Buffer* buf_;
  receive_fn receive_;
  std::tuple<Args...> args_;
};

}  // namespace epcomm
