// Open MPI's MPI_Allreduce over the same sizes as `cohort bench comm`.
// usage: mpirun -np N peer_mpi_allreduce [MIN_BYTES MAX_BYTES JSON]
#include <mpi.h>

#include <algorithm>
#include <vector>

#include "sweep.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  std::vector<PeerRow> rows;
  for (size_t bytes : peer_sizes(argc, argv)) {
    size_t count = bytes / 4;
    std::vector<float> buf(count, 1.0f);
    int iters = peer_iters(bytes);
    for (int i = 0; i < 3; ++i)
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    }
    double us = (MPI_Wtime() - t0) * 1e6 / iters, sum = 0;
    MPI_Allreduce(&us, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    us = sum / n;
    PeerRow row;
    row.bytes = bytes;
    row.time_us = us;
    row.busbw = static_cast<double>(bytes) / (us * 1e3) * 2.0 * (n - 1) / n;
    row.algo = "MPI_Allreduce";
    rows.push_back(row);
  }
  if (rank == 0) peer_report("openmpi", n, rows, argc > 3 ? argv[3] : nullptr);
  MPI_Finalize();
  return 0;
}
