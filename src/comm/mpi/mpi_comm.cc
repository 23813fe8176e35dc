// The `mpi` backend (COHORT_BACKEND=mpi): every collective is delegated to MPI, for clusters
// whose MPI is already tuned. Calls complete before they return; f16 and bf16 use user-defined
// MPI operations that call Cohort's reduction kernels.
#include <mpi.h>

#include <cstring>
#include <vector>

#include "cohort/comm/communicator.h"
#include "cohort/core/error.h"
#include "reduce/reduce.h"

namespace cohort::comm {

Work make_done_work(const char* algo, const char* reason);

namespace {

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    COHORT_THROW_AS(CommError, "MPI " << what << " failed: " << std::string(msg, len));
  }
}

MPI_Datatype mpi_type(DataType t) {
  switch (t) {
    case DataType::f32:
      return MPI_FLOAT;
    case DataType::f64:
      return MPI_DOUBLE;
    case DataType::i32:
      return MPI_INT32_T;
    case DataType::i64:
      return MPI_INT64_T;
    case DataType::u8:
      return MPI_UINT8_T;
    case DataType::f16:
    case DataType::bf16:
      return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

template <DataType T, RedOp O>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  comm::reduce(inout, inout, in, static_cast<size_t>(*len), T, O);
}

MPI_Op make_op(MPI_User_function* f) {
  MPI_Op op;
  MPI_Op_create(f, 1, &op);
  return op;
}

MPI_Op mpi_op(DataType t, RedOp op) {
  if (t == DataType::f16 || t == DataType::bf16) {
    static MPI_Op ops[2][4] = {
        {make_op(half_op<DataType::f16, RedOp::sum>), make_op(half_op<DataType::f16, RedOp::prod>),
         make_op(half_op<DataType::f16, RedOp::min>), make_op(half_op<DataType::f16, RedOp::max>)},
        {make_op(half_op<DataType::bf16, RedOp::sum>),
         make_op(half_op<DataType::bf16, RedOp::prod>),
         make_op(half_op<DataType::bf16, RedOp::min>),
         make_op(half_op<DataType::bf16, RedOp::max>)}};
    int k = op == RedOp::avg ? 0 : static_cast<int>(op);
    return ops[t == DataType::bf16 ? 1 : 0][k];
  }
  switch (op) {
    case RedOp::sum:
    case RedOp::avg:
      return MPI_SUM;
    case RedOp::prod:
      return MPI_PROD;
    case RedOp::min:
      return MPI_MIN;
    case RedOp::max:
      return MPI_MAX;
  }
  return MPI_SUM;
}

int icount(size_t n) {
  if (n > static_cast<size_t>(INT32_MAX))
    COHORT_THROW("mpi backend: count " << n << " exceeds INT_MAX");
  return static_cast<int>(n);
}

class MpiComm final : public Communicator {
 public:
  MpiComm(MPI_Comm c, bool owns_mpi) : comm_(c), owns_mpi_(owns_mpi) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm local;
    MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &local_rank_);
    MPI_Comm_size(local, &local_size_);
    MPI_Comm_free(&local);
    char name[MPI_MAX_PROCESSOR_NAME];
    int len = 0;
    MPI_Get_processor_name(name, &len);
    host_.assign(name, static_cast<size_t>(len));
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiComm() override {
    if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
    if (owns_mpi_) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  int num_hosts() const override { return size_ / std::max(1, local_size_); }
  const std::string& host() const override { return host_; }
  std::string describe() const override {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(v, &len);
    std::string s(v, static_cast<size_t>(len));
    return "mpi backend: " + std::to_string(size_) + " ranks on " + std::to_string(num_hosts()) +
           " host(s), " + s.substr(0, s.find(','));
  }

  Work allreduce(const void* s, void* r, size_t n, DataType t, RedOp op, CollOptions) override {
    check(MPI_Allreduce(s == r ? MPI_IN_PLACE : s, r, icount(n), mpi_type(t), mpi_op(t, op), comm_),
          "Allreduce");
    if (op == RedOp::avg) divide(r, n, t, size_);
    return make_done_work("mpi", "Open MPI chooses");
  }
  Work reduce_scatter(const void* s, void* r, size_t n, DataType t, RedOp op,
                      CollOptions) override {
    check(MPI_Reduce_scatter_block(s, r, icount(n), mpi_type(t), mpi_op(t, op), comm_),
          "Reduce_scatter_block");
    if (op == RedOp::avg) divide(r, n, t, size_);
    return make_done_work("mpi", "Open MPI chooses");
  }
  Work allgather(const void* s, void* r, size_t n, DataType t, CollOptions) override {
    const void* src = s == static_cast<uint8_t*>(r) + n * dtype_size(t) * rank_ ? MPI_IN_PLACE : s;
    check(MPI_Allgather(src, icount(n), mpi_type(t), r, icount(n), mpi_type(t), comm_),
          "Allgather");
    return make_done_work("mpi", "Open MPI chooses");
  }
  Work broadcast(const void* s, void* r, size_t n, DataType t, int root, CollOptions) override {
    if (rank_ == root && s != r) std::memmove(r, s, n * dtype_size(t));
    check(MPI_Bcast(r, icount(n), mpi_type(t), root, comm_), "Bcast");
    return make_done_work("mpi", "Open MPI chooses");
  }
  Work reduce(const void* s, void* r, size_t n, DataType t, RedOp op, int root,
              CollOptions) override {
    const void* src = (rank_ == root && s == r) ? MPI_IN_PLACE : s;
    check(MPI_Reduce(src, r, icount(n), mpi_type(t), mpi_op(t, op), root, comm_), "Reduce");
    if (rank_ == root && op == RedOp::avg) divide(r, n, t, size_);
    return make_done_work("mpi", "Open MPI chooses");
  }
  Work alltoall(const void* s, void* r, size_t n, DataType t, CollOptions) override {
    check(MPI_Alltoall(s == r ? MPI_IN_PLACE : s, icount(n), mpi_type(t), r, icount(n), mpi_type(t),
                       comm_),
          "Alltoall");
    return make_done_work("mpi", "Open MPI chooses");
  }
  Work gather(const void* s, void* r, size_t n, DataType t, int root, CollOptions) override {
    check(MPI_Gather(s, icount(n), mpi_type(t), r, icount(n), mpi_type(t), root, comm_), "Gather");
    return make_done_work("mpi", "Open MPI chooses");
  }
  Work scatter(const void* s, void* r, size_t n, DataType t, int root, CollOptions) override {
    check(MPI_Scatter(s, icount(n), mpi_type(t), r, icount(n), mpi_type(t), root, comm_),
          "Scatter");
    return make_done_work("mpi", "Open MPI chooses");
  }
  Work send(const void* d, size_t n, DataType t, int peer) override {
    check(MPI_Send(d, icount(n), mpi_type(t), peer, 0, comm_), "Send");
    return make_done_work("mpi", "Open MPI chooses");
  }
  Work recv(void* d, size_t n, DataType t, int peer) override {
    check(MPI_Recv(d, icount(n), mpi_type(t), peer, 0, comm_, MPI_STATUS_IGNORE), "Recv");
    return make_done_work("mpi", "Open MPI chooses");
  }
  Work barrier() override {
    check(MPI_Barrier(comm_), "Barrier");
    return make_done_work("mpi", "Open MPI chooses");
  }
  std::shared_ptr<Communicator> split(int color, int key) override {
    MPI_Comm c;
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &c), "Comm_split");
    if (c == MPI_COMM_NULL) return nullptr;
    return std::make_shared<MpiComm>(c, false);
  }
  void abort(const std::string&) override { MPI_Abort(comm_, 1); }

 private:
  MPI_Comm comm_;
  bool owns_mpi_;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string host_;
};

}  // namespace

std::shared_ptr<Communicator> make_mpi_communicator(const JobEnv&) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "Init_thread");
  }
  return std::make_shared<MpiComm>(MPI_COMM_WORLD, !inited);
}

}  // namespace cohort::comm
