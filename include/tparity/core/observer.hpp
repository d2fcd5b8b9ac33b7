// Named intermediate components, handed out by the ops as they are computed.
//
// Every op takes an `Observer<T>*` that may be null. With null, nothing is copied or reshaped for
// observation: the only cost is the pointer test. With an observer, the op hands each component in
// the canonical layout documented beside its name (batched and batch-first whatever the call's layout,
// so that two implementations can be compared element by element).
//
// The component is handed by reference to the very tensor the op goes on computing with, so an
// observer may overwrite its values (never its shape): that is teacher forcing. Feeding every
// component a reference's value measures each op's local error, on the reference's own inputs.
#pragma once

#include <string>

#include "tparity/core/tensor.hpp"

namespace tparity {

template <class T>
class Observer {
 public:
  virtual ~Observer() = default;
  virtual void on(const std::string& name, Tensor<T>& value) = 0;
};

// Forwards to a parent observer with every name prefixed ("sa." + "q" -> "sa.q"); one name may be
// renamed outright ("output" -> "sa_output").
template <class T>
class PrefixObserver final : public Observer<T> {
 public:
  PrefixObserver(Observer<T>* parent, std::string prefix, std::string rename_from = {}, std::string rename_to = {})
      : parent_(parent), prefix_(std::move(prefix)), from_(std::move(rename_from)), to_(std::move(rename_to)) {}
  void on(const std::string& name, Tensor<T>& value) override {
    parent_->on(!from_.empty() && name == from_ ? to_ : prefix_ + name, value);
  }
  // Null in, null out: keeps the no-observer path free.
  static Observer<T>* wrap(Observer<T>* parent, PrefixObserver& self) { return parent ? &self : nullptr; }

 private:
  Observer<T>* parent_;
  std::string prefix_, from_, to_;
};

}  // namespace tparity
