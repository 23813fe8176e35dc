// `cohort`: the one command-line tool. `cohort --help` lists the verbs.
#include <cstdio>
#include <map>

#include "cohort/core/error.h"
#include "verbs.h"

int main(int argc, char** argv) {
  CLI::App app{"Cohort: distributed training of convolutional networks, from one GPU to clusters"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "cohort 0.1.0");
  std::map<CLI::App*, cohort::cli::Run> runs;

  CLI::App* launch =
      app.add_subcommand("launch", "Start N local ranks of a program (torchrun-style)");
  runs[launch] = cohort::cli::add_launch(*launch);

  CLI::App* topo = app.add_subcommand("topo", "Hosts, transports and the algorithm per size");
  runs[topo] = cohort::cli::add_topo(*topo);

  CLI::App* make = app.add_subcommand("make-dataset", "Write a synthetic data set (scans)");
  runs[make] = cohort::cli::add_make_dataset(*make);

  CLI::App* pack = app.add_subcommand("pack", "Pack a data set into record shards");
  runs[pack] = cohort::cli::add_pack(*pack);

  CLI::App* train = app.add_subcommand("train", "Train a model (flags or --config FILE)");
  runs[train] = cohort::cli::add_train(*train);

  CLI::App* bench = app.add_subcommand("bench", "Benchmarks: comm, data, train");
  bench->require_subcommand(1);
  CLI::App* bench_comm =
      bench->add_subcommand("comm", "Collective bandwidth and latency, nccl-tests style");
  runs[bench_comm] = cohort::cli::add_bench_comm(*bench_comm);
  CLI::App* bench_data = bench->add_subcommand("data", "Input pipeline throughput and determinism");
  runs[bench_data] = cohort::cli::add_bench_data(*bench_data);
  CLI::App* bench_train =
      bench->add_subcommand("train", "Training step time on synthetic data, with the op split");
  runs[bench_train] = cohort::cli::add_bench_train(*bench_train);

  CLI::App* ckpt = app.add_subcommand("checkpoint", "Inspect or consolidate a checkpoint");
  ckpt->require_subcommand(1);
  CLI::App* inspect = ckpt->add_subcommand("inspect", "Step, world, mode, tensors and sizes");
  runs[inspect] = cohort::cli::add_checkpoint_inspect(*inspect);
  CLI::App* consolidate =
      ckpt->add_subcommand("consolidate", "The whole model as one safetensors file");
  runs[consolidate] = cohort::cli::add_checkpoint_consolidate(*consolidate);

  CLI::App* doctor =
      app.add_subcommand("doctor", "Explain a hang or failure from the ranks' flight records");
  runs[doctor] = cohort::cli::add_doctor(*doctor);

  CLI::App* plan = app.add_subcommand(
      "plan", "Predict step time, memory and scaling of a model on a cluster, and recommend");
  runs[plan] = cohort::cli::add_plan(*plan);

  CLI::App* report = app.add_subcommand(
      "report", "One HTML page (SVG plots, PNG copies) of one or more runs' JSON logs");
  runs[report] = cohort::cli::add_report(*report);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [cmd, run] : runs) {
      if (cmd->parsed()) return run();
    }
  } catch (const cohort::Error& e) {
    std::fprintf(stderr, "cohort: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cohort: error: %s\n", e.what());
    return 1;
  }
  return 1;
}
