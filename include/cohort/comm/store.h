// The rendezvous store: a TCP key-value server that every rank of a job reaches first (like
// torch's TCPStore), or a framework's own store behind KeyValueService. Keys are strings, values
// are bytes. Every call has a timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cohort/comm/socket.h"

namespace cohort::comm {

class StoreServer {
 public:
  // Binds host:port (0 = ephemeral) and serves on a thread until destroyed. Connections that do
  // not open with the job token, or that send malformed or oversized frames, are dropped.
  StoreServer(const std::string& host, uint16_t port, std::string token);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  uint16_t port() const { return port_; }

 private:
  void serve();
  Socket listener_;
  uint16_t port_ = 0;
  std::string token_;
  int wake_[2] = {-1, -1};
  std::thread thread_;
};

// What a Store talks to. Cohort's TCP client is one; a framework that brings its own store
// supplies another (the PyTorch backend wraps torch's c10d::Store). Keys arrive with the Store's
// prefix applied; `timeout` bounds each call, `wait` how long a key may take to appear.
class KeyValueService {
 public:
  using Millis = std::chrono::milliseconds;
  virtual ~KeyValueService() = default;
  virtual void set(const std::string& key, const std::string& value, Millis timeout) = 0;
  // nullopt when the key did not appear within `wait`.
  virtual std::optional<std::string> get_for(const std::string& key, Millis wait,
                                             Millis timeout) = 0;
  virtual int64_t add(const std::string& key, int64_t delta, Millis timeout) = 0;
  // Sets key to desired if its value is expected ("" = absent); returns the value now stored.
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired, Millis timeout) = 0;
  // false when some key did not appear within `wait`.
  virtual bool wait(const std::vector<std::string>& keys, Millis wait) = 0;
  virtual void erase(const std::string& key, Millis timeout) = 0;
  // The store's host: each rank binds its links to the interface that routes there.
  virtual std::string host() const = 0;
};

class Store {
 public:
  using Millis = std::chrono::milliseconds;
  // Connects to Cohort's StoreServer, opening with the job token.
  Store(const Endpoint& server, const std::string& token, Millis timeout);
  // Runs over another service (a framework's own store).
  Store(std::shared_ptr<KeyValueService> service, Millis timeout);

  // A view of the same connection whose keys are all prefixed (one namespace per communicator).
  Store prefixed(const std::string& prefix) const;
  // The same connection with another timeout (error paths use a short one).
  Store with_timeout(Millis timeout) const;

  void set(const std::string& key, const std::string& value);
  std::string get(const std::string& key);  // waits for the key up to the timeout
  std::optional<std::string> get_for(const std::string& key, Millis wait);
  int64_t add(const std::string& key, int64_t delta);
  // Sets key to desired if its value is expected ("" = absent); returns the value now stored.
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired);
  void wait(const std::vector<std::string>& keys);
  void erase(const std::string& key);
  Millis timeout() const { return timeout_; }
  std::string host() const { return service_->host(); }

 private:
  Store() = default;
  std::shared_ptr<KeyValueService> service_;
  std::string prefix_;
  Millis timeout_{300000};
};

}  // namespace cohort::comm
