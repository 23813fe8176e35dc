// TCP transport between hosts: non-blocking sockets, TCP_NODELAY for small messages, and large
// socket buffers. Several connections per peer ("lanes") are opened when COHORT_TCP_STREAMS > 1;
// the engine stripes large messages across them.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../link.h"
#include "../peer.h"
#include "cohort/comm/socket.h"
#include "cohort/comm/store.h"

namespace cohort::comm {

struct TcpOptions {
  int streams = 1;
  int socket_buffer = 4 << 20;
  std::string token;
  uint64_t comm_id = 0;
  Clock::time_point deadline;
};

// Opens the listener this rank publishes ("tcp/<rank>" in the store).
class TcpListener {
 public:
  explicit TcpListener(const std::string& bind_host);
  std::string address() const { return host_ + ":" + std::to_string(port_); }
  const Socket& socket() const { return sock_; }

 private:
  Socket sock_;
  std::string host_;
  uint16_t port_ = 0;
};

// Connects lanes to every peer in `peers` (lower ranks dial, higher ranks accept, tokens checked).
// Returns, per peer rank, its lanes.
std::map<int, std::vector<std::unique_ptr<Link>>> connect_tcp_peers(
    Store& store, TcpListener& listener, const TcpOptions& opt, const PeerDesc& me,
    const std::vector<PeerDesc>& peers);

}  // namespace cohort::comm
