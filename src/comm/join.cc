// Joining the job: the world communicator from the job's description (cohort launch, torchrun,
// Open MPI or Slurm variables), or through a store another framework set up (`join`: the PyTorch
// backend). Rank 0 (or the launcher) hosts Cohort's store; every rank checks the world size,
// claims its rank once, publishes its host and pid, and waits for all the others.
#include <unistd.h>

#include "cohort/core/error.h"
#include "native_comm.h"

namespace cohort::comm {

namespace detail {

namespace {
bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}
}  // namespace

std::shared_ptr<NativeComm> NativeComm::init_world(const JobEnv& env, Settings s) {
  PeerDesc me{env.rank, s.host_id, static_cast<int>(::getpid())};
  if (env.world == 1) {
    // A job of one needs no store; a private in-process one keeps the code paths uniform.
    auto server = std::make_unique<StoreServer>("127.0.0.1", 0, env.token);
    Store store(Endpoint{"127.0.0.1", server->port()}, env.token, s.timeout);
    auto c = std::make_shared<NativeComm>(store.prefixed("w/"), env.token, "world", 0,
                                          std::vector<PeerDesc>{me}, s);
    c->keep_alive(std::move(server));
    return c;
  }
  std::unique_ptr<StoreServer> server;
  if (env.rank == 0 && !env.store_external) {
    std::string bind = is_loopback(env.master_addr) ? env.master_addr : "0.0.0.0";
    server = std::make_unique<StoreServer>(bind, env.master_port, env.token);
  }
  Store store(Endpoint{env.master_addr, env.master_port}, env.token, s.timeout);
  return join_world(std::move(store), env.rank, env.world, env.token, s, std::move(server));
}

std::shared_ptr<NativeComm> NativeComm::join_world(Store store, int rank, int world,
                                                   const std::string& token, Settings s,
                                                   std::unique_ptr<StoreServer> server) {
  PeerDesc me{rank, s.host_id, static_cast<int>(::getpid())};
  // Every rank must agree on the world size, and each rank index must be claimed once.
  // A rank that finds the job inconsistent publishes why, so that the others fail with the
  // same reason instead of a bare timeout.
  auto refuse = [&](const std::string& why) {
    try {
      store.with_timeout(std::chrono::milliseconds(2000)).compare_set("abort", "", why);
    } catch (const std::exception&) {
    }
    COHORT_THROW_AS(CommError, why);
  };
  std::string agreed = store.compare_set("world_size", "", std::to_string(world));
  if (agreed != std::to_string(world)) {
    refuse("rank " + std::to_string(rank) + " was started with world size " +
           std::to_string(world) + " but other ranks registered world size " + agreed);
  }
  std::string who = me.host + " pid " + std::to_string(me.pid);
  std::string owner = store.compare_set("rank/" + std::to_string(rank), "", who);
  if (owner != who) {
    refuse("rank " + std::to_string(rank) + " is claimed twice: by " + owner + " and by " + who);
  }
  store.set("peer/" + std::to_string(rank), me.host + "\n" + std::to_string(me.pid));
  std::vector<PeerDesc> members;
  const auto deadline = Clock::now() + s.timeout;
  for (int r = 0; r < world; ++r) {
    std::optional<std::string> got;
    while (!(got = store.get_for("peer/" + std::to_string(r), std::chrono::milliseconds(200)))) {
      if (auto why = store.get_for("abort", std::chrono::milliseconds(0))) {
        COHORT_THROW_AS(CommError, "rank " << rank << ": the job failed to start: " << *why);
      }
      if (Clock::now() > deadline) {
        COHORT_THROW_AS(TimeoutError, "rank " << rank << ": rank " << r << " did not join within "
                                              << s.timeout.count() / 1000.0
                                              << " s (COHORT_TIMEOUT)");
      }
    }
    std::string v = *got;
    auto nl = v.find('\n');
    members.push_back(PeerDesc{r, v.substr(0, nl), std::atoi(v.c_str() + nl + 1)});
  }
  auto c = std::make_shared<NativeComm>(store.prefixed("w/"), token, "world", rank, members, s);
  if (server) c->keep_alive(std::move(server));
  if (s.probe) c->probe_links();
  return c;
}

}  // namespace detail

#ifdef COHORT_HAVE_MPI
std::shared_ptr<Communicator> make_mpi_communicator(const JobEnv& env);
#endif
// nccl/nccl_comm.cc where NCCL is built, else nccl/nccl_absent.cc.
std::shared_ptr<Communicator> make_nccl_communicator(const JobEnv& env, const detail::Settings& s);

std::shared_ptr<Communicator> join(Store store, int rank, int world, const InitOptions& opt) {
  detail::Settings s = detail::Settings::from_env();
  if (opt.timeout.count() > 0) s.timeout = opt.timeout;
  // Whichever rank comes first proposes the token; every rank uses the one stored.
  const std::string token = store.compare_set("token", "", detail::random_token());
  return detail::NativeComm::join_world(std::move(store), rank, world, token, s, nullptr);
}

std::shared_ptr<Communicator> init(const InitOptions& opt) {
  JobEnv env = detect_job_env();
  detail::Settings s = detail::Settings::from_env();
  if (opt.timeout.count() > 0) s.timeout = opt.timeout;
  const std::string backend = opt.backend.empty() ? s.backend : opt.backend;
  if (backend == "mpi") {
#ifdef COHORT_HAVE_MPI
    return make_mpi_communicator(env);
#else
    COHORT_THROW(
        "COHORT_BACKEND=mpi: this build has no MPI support (configure with -DCOHORT_MPI=ON)");
#endif
  }
  if (backend == "nccl") return make_nccl_communicator(env, s);
  if (backend != "cohort") {
    COHORT_THROW("COHORT_BACKEND='" << backend << "': expected cohort, mpi or nccl");
  }
  return detail::NativeComm::init_world(env, s);
}

}  // namespace cohort::comm
