// Each verb of the `cohort` CLI registers its options on a CLI11 subcommand and returns the
// function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace cohort::cli {

using Run = std::function<int()>;

Run add_launch(CLI::App& app);
Run add_bench_comm(CLI::App& bench);
Run add_make_dataset(CLI::App& app);
Run add_pack(CLI::App& app);
Run add_topo(CLI::App& app);
Run add_bench_data(CLI::App& bench);
Run add_train(CLI::App& app);
Run add_bench_train(CLI::App& bench);
Run add_checkpoint_inspect(CLI::App& app);
Run add_checkpoint_consolidate(CLI::App& app);
Run add_doctor(CLI::App& app);
Run add_plan(CLI::App& app);
Run add_report(CLI::App& app);

}  // namespace cohort::cli
