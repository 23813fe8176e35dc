// Checkpoints: an interrupted run resumed from its checkpoint continues the same loss curve; a
// writer killed half-way through leaves the previous checkpoint loadable; a damaged file is
// refused; a rank killed during training fails the job with its name.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "cohort/dist/checkpoint.h"
#include "cohort/train/trainer.h"
#include "testing/scans.h"
#include "testing/temp_dir.h"

namespace cohort::dist {
namespace {

using testing::TempDir;

namespace fs = std::filesystem;

train::TrainConfig small_run(const TempDir& dir) {
  train::TrainConfig c;
  c.model = "smallcnn";
  c.data = dir.file("scans");
  if (!fs::exists(c.data)) testing::make_scan_set(c.data, 96, 24, 3);
  c.epochs = 3;
  c.batch = 16;
  c.image_size = 24;
  c.lr = 0.05f;
  c.warmup_epochs = 0.5f;
  c.log_every = 100;
  c.workers = 2;
  return c;
}

TEST(Checkpoint, ResumedRunContinuesTheSameLossCurve) {
  TempDir dir;
  train::TrainConfig c = small_run(dir);
  const train::TrainSummary full = train::run_training(c);
  ASSERT_EQ(full.losses.size(), 18u);  // 6 steps per epoch
  // The same run, stopped after step 8 (inside epoch 2) with a checkpoint every 4 steps...
  train::TrainConfig first = c;
  first.max_steps = 8;
  first.checkpoint_every = 4;
  first.checkpoint_dir = dir.file("ckpt");
  train::run_training(first);
  // ... and resumed to the end.
  train::TrainConfig rest = c;
  rest.resume = dir.file("ckpt");
  const train::TrainSummary resumed = train::run_training(rest);
  EXPECT_EQ(resumed.first_step, 8);
  ASSERT_EQ(resumed.losses.size(), 10u);
  for (size_t i = 0; i < resumed.losses.size(); ++i)
    EXPECT_NEAR(resumed.losses[i], full.losses[8 + i], 1e-5f * std::max(1.0f, full.losses[8 + i]))
        << "step " << 8 + i;
}

// The same with two ranks under cohort launch: rank 0 reads the checkpoint, every rank takes it.
TEST(Checkpoint, TwoRankResumeContinuesTheSameLossCurve) {
  const char* bin = std::getenv("COHORT_BIN");
  ASSERT_NE(bin, nullptr);
  TempDir dir;
  train::TrainConfig c = small_run(dir);
  const std::string base = std::string("timeout 120 ") + bin + " launch --nproc-per-node 2 -- " +
                           bin + " train --model smallcnn --data " + c.data +
                           " --epochs 3 --batch 8 --image-size 24 --log-every 100 --json ";
  auto run = [&](const std::string& json, const std::string& extra) {
    const std::string cmd =
        base + dir.file(json) + " " + extra + " > " + dir.file(json) + ".out 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  };
  run("full.json", "");
  run("first.json", "--max-steps 7 --checkpoint-dir " + dir.file("ck"));
  run("rest.json", "--resume " + dir.file("ck"));
  auto losses = [&](const std::string& json) {
    std::vector<float> out;
    const nlohmann::json log = nlohmann::json::parse(std::ifstream(dir.file(json)));
    for (const auto& s : log["steps"]) out.push_back(s["loss"].get<float>());
    return out;
  };
  const auto full = losses("full.json"), rest = losses("rest.json");
  ASSERT_EQ(full.size(), 18u);
  ASSERT_EQ(rest.size(), 11u);
  for (size_t i = 0; i < rest.size(); ++i)
    EXPECT_NEAR(rest[i], full[7 + i], 1e-5f * std::max(1.0f, full[7 + i])) << "step " << 7 + i;
}

TEST(Checkpoint, WriterKilledHalfWayLeavesThePreviousOneLoadable) {
  TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // A large model, so that each write takes a while; write until killed (bounded: 200).
    auto m = nn::make_model("resnet50", nn::ModelOptions{});
    auto opt = nn::make_optimizer(*m, nn::OptimOptions{});
    for (int i = 1; i <= 200; ++i) {
      RunPosition p;
      p.step = i;
      save_checkpoint(ckpt, *m, *opt, p);
      std::ofstream(dir.file("written")) << i;
    }
    ::_exit(0);
  }
  // Kill it after its first checkpoint has been written...
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(dir.file("written")) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // ... at a moment when the next one's temporary file exists, i.e. mid-write.
  auto writing = [&]() {
    try {  // the writer removes older step directories as it goes
      for (const auto& e : fs::recursive_directory_iterator(ckpt))
        if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
    } catch (const fs::filesystem_error&) {
    }
    return false;
  };
  while (!writing() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the writer finished 200 checkpoints before the kill";
  // The kill came in the middle of a write: its temporary file is still there.
  EXPECT_TRUE(writing()) << "the kill fell between two checkpoint writes";
  int written = 0;
  std::ifstream(dir.file("written")) >> written;
  ASSERT_GE(written, 1);
  auto m = nn::make_model("resnet50", nn::ModelOptions{});
  auto opt = nn::make_optimizer(*m, nn::OptimOptions{});
  const RunPosition p = load_checkpoint(ckpt, *m, *opt);
  // The file holds the last complete checkpoint: the one reported, or the one just after it
  // if the kill came between its rename and the report.
  EXPECT_TRUE(p.step == written || p.step == written + 1) << p.step << " vs " << written;
}

TEST(Checkpoint, DamagedOrForeignFilesAreRefused) {
  TempDir dir;
  auto m = nn::make_model("smallcnn", nn::ModelOptions{1, 2, 16, 0});
  auto opt = nn::make_optimizer(*m, nn::OptimOptions{});
  save_checkpoint(dir.file("c"), *m, *opt, RunPosition{});
  {
    // Flip one byte in the data section.
    std::string shard;  // the one file of a one-process checkpoint
    for (const auto& e : fs::recursive_directory_iterator(dir.file("c")))
      if (e.path().extension() == ".safetensors") shard = e.path().string();
    ASSERT_FALSE(shard.empty());
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-10, std::ios::end);
    char b;
    f.read(&b, 1);
    f.seekp(-10, std::ios::end);
    b = static_cast<char>(b ^ 0x40);
    f.write(&b, 1);
  }
  try {
    load_checkpoint(dir.file("c"), *m, *opt);
    ADD_FAILURE() << "a damaged checkpoint loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CRC-32C"), std::string::npos) << e.what();
  }
  save_checkpoint(dir.file("d"), *m, *opt, RunPosition{});
  auto other = nn::make_model("resnet18", nn::ModelOptions{});
  auto other_opt = nn::make_optimizer(*other, nn::OptimOptions{});
  try {
    load_checkpoint(dir.file("d"), *other, *other_opt);
    ADD_FAILURE() << "a smallcnn checkpoint loaded into resnet18";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds a smallcnn"), std::string::npos) << e.what();
  }
  // An index whose fields have the wrong type: an error naming the index and the field.
  const std::string index = checkpoint_index(dir.file("d"));
  std::string text;
  {
    std::ifstream in(index);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  for (const auto& [from, to, needle] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"\"step\":", "\"step\":\"three\",\"was\":", "'step' is \"three\", not an integer"},
           {"\"files\":", "\"files\":7,\"was\":", "'files' is not a list"},
           {"\"crc32c\":", "\"crc32c\":-1,\"was\":", "lacks a path or a CRC-32C"},
           // (fuzz_files: a model refused it later, naming no file)
           {"\"num_classes\":", "\"num_classes\":0,\"was\":", "'num_classes' is 0, not in 1.."}}) {
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from << " in " << text;
    std::ofstream(index) << text.substr(0, at) + to + text.substr(at + from.size());
    try {
      load_checkpoint(dir.file("d"), *m, *opt);
      ADD_FAILURE() << "an index with " << to << " loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(index), std::string::npos) << e.what();
    }
  }
}

// Under cohort launch: kill one training rank; the launcher stops the job, exits non-zero
// within seconds and names the rank.
TEST(Launch, RankKilledDuringTrainingFailsTheJob) {
  const char* bin = std::getenv("COHORT_BIN");
  ASSERT_NE(bin, nullptr);
  TempDir dir;
  train::TrainConfig c = small_run(dir);
  const std::string log = dir.file("launch.txt");
  const std::string cmd =
      std::string("timeout 120 ") + bin + " launch --nproc-per-node 2 --grace 2 -- " + bin +
      " train --model smallcnn --data " + c.data +
      " --epochs 1000 --batch 8 --image-size 24 --log-every 1 > " + log + " 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<bool> killed{false};
  std::thread killer([&]() {
    // Once training runs, kill the rank whose RANK is 1.
    for (int i = 0; i < 600; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::ifstream in(log);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (text.find("step 3/") == std::string::npos) continue;
      for (const auto& e : fs::directory_iterator("/proc")) {
        std::ifstream cmdline(e.path() / "cmdline");
        std::string argv((std::istreambuf_iterator<char>(cmdline)),
                         std::istreambuf_iterator<char>());
        if (argv.find(c.data) == std::string::npos) continue;
        std::ifstream env(e.path() / "environ");
        const std::string vars =
            std::string(1, '\0') +
            std::string((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
        if (vars.find(std::string("\0RANK=1\0", 8)) == std::string::npos) continue;
        killed = ::kill(std::stoi(e.path().filename()), SIGKILL) == 0;
        return;
      }
    }
  });
  const int rc = std::system(cmd.c_str());
  killer.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(killed) << "rank 1 was never found to kill:\n" << text;
  EXPECT_NE(rc, 0) << text;
  EXPECT_NE(text.find("rank 1"), std::string::npos) << text;
  EXPECT_NE(text.find("SIGKILL"), std::string::npos) << text;
  EXPECT_LT(secs, 60) << text;
}

// Ranks whose options give them different numbers of steps get an error naming the counts
// before the first step, not a hang in an allreduce.
TEST(Launch, RanksThatWouldRunOutOfDataUnevenlyFailClearly) {
  const char* bin = std::getenv("COHORT_BIN");
  ASSERT_NE(bin, nullptr);
  TempDir dir;
  train::TrainConfig c = small_run(dir);
  const std::string cmd =
      std::string("timeout 120 ") + bin + " launch --nproc-per-node 2 -- sh -c '" + "exec " + bin +
      " train --model smallcnn --data " + c.data +
      " --image-size 24 --batch $((8 + 8 * RANK))' > " + dir.file("out.txt") + " 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  std::ifstream in(dir.file("out.txt"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("ranks disagree on the steps per epoch"), std::string::npos) << text;
}

}  // namespace
}  // namespace cohort::dist
