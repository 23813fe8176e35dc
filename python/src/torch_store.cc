// TorchStore: c10d::Store's calls behind Cohort's KeyValueService. c10d has no "get within a
// wait", so waits poll check() (1 ms apart at first, 20 ms at most); rendezvous only.
#include "torch_store.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <thread>

#include "cohort/core/error.h"

namespace cohort::python {

namespace {

std::vector<uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string text(const std::vector<uint8_t>& v) {
  return {v.begin(), v.end()};
}

// Runs one store call; torch's errors come back as Cohort's, naming the key.
template <typename F>
auto guarded(const char* what, const std::string& key, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    COHORT_THROW_AS(CommError,
                    "torch's store: " << what << " '" << key << "' failed: " << e.what());
  }
}

// Polls until every key exists or `wait` passed.
bool poll(c10d::Store& store, const std::vector<std::string>& keys,
          std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (store.check(keys)) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

}  // namespace

TorchStore::TorchStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {
  host_ = "127.0.0.1";
  c10::intrusive_ptr<c10d::Store> s = store_;
  while (auto* prefix = dynamic_cast<c10d::PrefixStore*>(s.get())) s = prefix->getUnderlyingStore();
  if (auto* tcp = dynamic_cast<c10d::TCPStore*>(s.get())) host_ = tcp->getHost();
}

void TorchStore::set(const std::string& key, const std::string& value, Millis) {
  guarded("set", key, [&] { store_->set(key, bytes(value)); });
}

std::optional<std::string> TorchStore::get_for(const std::string& key, Millis wait, Millis) {
  return guarded("get", key, [&]() -> std::optional<std::string> {
    if (!poll(*store_, {key}, wait)) return std::nullopt;
    return text(store_->get(key));
  });
}

int64_t TorchStore::add(const std::string& key, int64_t delta, Millis) {
  return guarded("add", key, [&] { return store_->add(key, delta); });
}

std::string TorchStore::compare_set(const std::string& key, const std::string& expected,
                                    const std::string& desired, Millis) {
  return guarded("compare_set", key,
                 [&] { return text(store_->compareSet(key, bytes(expected), bytes(desired))); });
}

bool TorchStore::wait(const std::vector<std::string>& keys, Millis wait) {
  return guarded("wait", keys.empty() ? "" : keys[0], [&] { return poll(*store_, keys, wait); });
}

void TorchStore::erase(const std::string& key, Millis) {
  guarded("erase", key, [&] { store_->deleteKey(key); });
}

}  // namespace cohort::python
