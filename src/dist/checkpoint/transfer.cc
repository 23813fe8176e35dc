// Checkpoint files carried between ranks and hosts (see internal.h): no shared file system is
// assumed.
#include "internal.h"

namespace cohort::dist {
namespace checkpoint_impl {

// Each rank's host, named by the lowest rank on it: ranks of one host share its disk, ranks of
// different hosts may not (no shared file system is assumed).
std::vector<int> hosts_of_ranks(comm::Communicator& w) {
  const int64_t mine = static_cast<int64_t>(std::hash<std::string>{}(w.host()));
  std::vector<int64_t> all(static_cast<size_t>(w.size()));
  w.allgather(&mine, all.data(), 1, comm::DataType::i64).wait();
  std::vector<int> host(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    host[r] = static_cast<int>(std::find(all.begin(), all.end(), all[r]) - all.begin());
  }
  return host;
}

// The rank that keeps a copy of rank r's file: on the next host (hosts in the order of their
// lowest ranks, the last followed by the first), the rank at r's place among its host's ranks,
// or that host's last rank. r itself when there is one host.
int keeper_of(int r, const std::vector<int>& host) {
  std::vector<int> leads;
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i] == static_cast<int>(i)) leads.push_back(static_cast<int>(i));
  }
  if (leads.size() < 2) return r;
  const size_t at =
      static_cast<size_t>(std::find(leads.begin(), leads.end(), host[r]) - leads.begin());
  const int next = leads[(at + 1) % leads.size()];
  int place = 0;
  for (int i = 0; i < r; ++i) place += host[i] == host[r];
  int keeper = next;
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i] != next) continue;
    keeper = static_cast<int>(i);
    if (place-- == 0) break;
  }
  return keeper;
}

// A checkpoint file carried from the rank that holds it to ranks that write it, in pieces of
// kPassPiece bytes through one reused buffer: `move` carries a piece from the holder to the others
// (a send and a receive, or a broadcast), and every rank taking part calls it alike. A ResNet-18
// file (89 MB) read whole, sent whole and received into a fresh buffer took 1.96-2.23 s per
// checkpoint between two emulated hosts here (the read alone 0.95 s); in pieces 0.35-0.84 s.
// Returns the file's size; a holder that cannot read its file passes -1. A writer takes every
// piece the holder sends even after its own write failed, so that no rank is left waiting.
// Errors go to `error`: the read, the write, or the CRC-32C check against `crc`.
constexpr size_t kPassPiece = size_t{8} << 20;

int64_t pass_file(const std::function<void(void*, size_t)>& move, int holder, bool holds,
                  const std::string& src, bool writes, const std::string& dst, uint32_t crc,
                  std::string* error) {
  int fd = -1;
  // Closed however this returns: a peer lost mid-pass throws out of `move`.
  const std::unique_ptr<int, void (*)(int*)> close_fd(&fd, [](int* f) {
    if (*f >= 0) ::close(*f);
  });
  int64_t n = -1;
  if (holds) {
    fd = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd >= 0 && ::fstat(fd, &st) == 0) {
      n = static_cast<int64_t>(st.st_size);
    } else {
      *error = "cannot read " + src + ": " + errno_string(errno);
    }
  }
  move(&n, sizeof n);
  if (n < 0) {
    if (!holds)
      *error = "rank " + std::to_string(holder) + " could not read the file it was to pass (" +
               dst + ')';
    return n;
  }
  std::vector<char> piece(std::min(kPassPiece, static_cast<size_t>(n)));
  int64_t moved = 0;
  auto pieces = [&](const nn::ByteSink* sink) {
    while (moved < n) {
      const size_t len = static_cast<size_t>(std::min<int64_t>(n - moved, piece.size()));
      if (holds) {
        size_t got = 0;
        while (got < len) {
          const ssize_t r = ::pread(fd, piece.data() + got, len - got, moved + got);
          if (r < 0 && errno == EINTR) continue;
          if (r <= 0) {  // the file shrank or failed: the rest goes as zeros, which the CRC refuses
            if (error->empty()) {
              *error = "reading " + src + " at byte " + std::to_string(moved + got) + ": " +
                       (r < 0 ? errno_string(errno) : std::string("the file ends early"));
            }
            std::fill(piece.begin() + got, piece.begin() + len, 0);
            break;
          }
          got += static_cast<size_t>(r);
        }
      }
      move(piece.data(), len);
      moved += static_cast<int64_t>(len);
      if (sink) (*sink)(piece.data(), len);
    }
  };
  if (writes) {
    try {
      fs::create_directories(fs::path(dst).parent_path());
      nn::write_stream_atomically(
          dst, [&](const nn::ByteSink& sink) { pieces(&sink); },
          [&](const std::string& tmp) {
            const uint32_t got = file_data_crc(tmp);
            COHORT_CHECK(got == crc,
                         tmp << " arrived with CRC " << got << ", the writer's is " << crc);
          });
    } catch (const CommError&) {
      throw;  // the holder is gone: nothing more comes
    } catch (const std::exception& e) {
      *error = e.what();
      pieces(nullptr);  // the rest of what the holder sends
    }
  } else {
    pieces(nullptr);
  }
  return n;
}

// pass_file from rank `from` to rank `to` (a send and a receive); other ranks do nothing.
int64_t pass_file_to(comm::Communicator& w, int from, int to, const std::string& src,
                     const std::string& dst, uint32_t crc, std::string* error) {
  if (w.rank() != from && w.rank() != to) return 0;
  const auto move = [&](void* p, size_t len) {
    if (w.rank() == from) {
      w.send(p, len, comm::DataType::u8, to).wait();
    } else {
      w.recv(p, len, comm::DataType::u8, from).wait();
    }
  };
  return pass_file(move, from, w.rank() == from, src, w.rank() == to, dst, crc, error);
}

// Rank `root`'s bytes on every rank.
std::string broadcast_bytes(comm::Communicator& w, int root, std::string bytes) {
  int64_t n = static_cast<int64_t>(bytes.size());
  w.broadcast(&n, &n, 1, comm::DataType::i64, root).wait();
  bytes.resize(static_cast<size_t>(n));
  w.broadcast(bytes.data(), bytes.data(), bytes.size(), comm::DataType::u8, root).wait();
  return bytes;
}

}  // namespace checkpoint_impl

}  // namespace cohort::dist
