// A non-owning reference to a callable (like c10::function_ref, which csrc/core cannot include): two
// pointers, no allocation, so that a hot call can take a callback it runs only on its slow path. The
// callable must outlive the reference (a lambda passed straight to the call does).
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace fastpipe {

template <class Signature>
class FunctionRef;

template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef> &&
                                              std::is_invocable_r_v<R, F&, Args...>>>
  FunctionRef(F&& f)  // implicit: a lambda argument converts
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace fastpipe
