// Cohort's rendezvous over the store PyTorch hands a backend (a c10d::Store: TCPStore, FileStore
// or HashStore, usually behind PrefixStores), so that the backend needs no second port.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "cohort/comm/store.h"

namespace cohort::python {

class TorchStore : public comm::KeyValueService {
 public:
  explicit TorchStore(c10::intrusive_ptr<c10d::Store> store);

  void set(const std::string& key, const std::string& value, Millis timeout) override;
  std::optional<std::string> get_for(const std::string& key, Millis wait, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta, Millis timeout) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired, Millis timeout) override;
  bool wait(const std::vector<std::string>& keys, Millis wait) override;
  void erase(const std::string& key, Millis timeout) override;
  // The TCPStore's host under the prefixes; 127.0.0.1 for stores that live in files or memory.
  std::string host() const override { return host_; }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::string host_;
};

}  // namespace cohort::python
