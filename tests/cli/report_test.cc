// `cohort report` as a user runs it (COHORT_BIN): real training runs (1 rank, and 2 ranks under
// cohort launch) write their JSON logs, the report draws them on one page with PNG copies, and
// a real browser (Debian's chromium, headless) opens the page: the screenshot is not blank, the
// runs' lines are in it, every plot in the browser's DOM has drawn marks, and the console is
// clean. Logs that lack data say so in the plot; bad logs are errors naming file and field.
#include <dirent.h>
#include <spng.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/shell.h"
#include "testing/temp_dir.h"

namespace {

using cohort::testing::cohort_bin;
using cohort::testing::sh;
using cohort::testing::TempDir;
namespace fs = std::filesystem;

const std::vector<std::string> kPlots = {
    "loss", "lr", "val_accuracy", "val_auc", "images_per_s", "step_breakdown", "memory"};

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

struct Image {
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> rgba;
};

// Decodes a PNG with libspng (the codec the data pipeline uses) to 8-bit RGBA.
Image decode_png(const std::string& path) {
  const std::string bytes = read(path);
  Image im;
  spng_ctx* ctx = spng_ctx_new(0);
  spng_ihdr ihdr{};
  size_t size = 0;
  if (spng_set_png_buffer(ctx, bytes.data(), bytes.size()) == 0 && spng_get_ihdr(ctx, &ihdr) == 0 &&
      spng_decoded_image_size(ctx, SPNG_FMT_RGBA8, &size) == 0) {
    im.rgba.resize(size);
    if (spng_decode_image(ctx, im.rgba.data(), size, SPNG_FMT_RGBA8, 0) == 0) {
      im.width = ihdr.width;
      im.height = ihdr.height;
    } else {
      im.rgba.clear();
    }
  }
  spng_ctx_free(ctx);
  return im;
}

// Pixels not near white: what was drawn.
size_t ink(const Image& im) {
  size_t n = 0;
  for (size_t i = 0; i + 3 < im.rgba.size(); i += 4)
    n += im.rgba[i] < 200 || im.rgba[i + 1] < 200 || im.rgba[i + 2] < 200;
  return n;
}

// Pixels within `tol` of a colour "#rrggbb" in every channel.
size_t near(const Image& im, const std::string& hex, int tol = 12) {
  const int c[3] = {std::stoi(hex.substr(1, 2), nullptr, 16),
                    std::stoi(hex.substr(3, 2), nullptr, 16),
                    std::stoi(hex.substr(5, 2), nullptr, 16)};
  size_t n = 0;
  for (size_t i = 0; i + 3 < im.rgba.size(); i += 4) {
    bool ok = true;
    for (int k = 0; k < 3; ++k) ok = ok && std::abs(im.rgba[i + k] - c[k]) <= tol;
    n += ok;
  }
  return n;
}

// Every <svg>..</svg> of a page.
std::vector<std::string> svgs_of(const std::string& html) {
  std::vector<std::string> out;
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1)) {
    const size_t end = html.find("</svg>", at);
    if (end == std::string::npos) break;
    out.push_back(html.substr(at, end - at));
  }
  return out;
}

// The data marks of a plot: polylines with at least two points, and filled paths (bars,
// markers). Axes and grid are <line>s and do not count.
size_t data_marks(const std::string& svg) {
  static const std::regex polyline(R"re(<polyline[^>]*points="([^"]*)")re");
  static const std::regex path(R"re(<path[^>]*\sd="M[^"]+")re");
  static const std::regex point(R"(-?[0-9.]+,-?[0-9.]+)");
  size_t n = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), polyline);
       it != std::sregex_iterator(); ++it) {
    const std::string pts = (*it)[1];
    n += std::distance(std::sregex_iterator(pts.begin(), pts.end(), point),
                       std::sregex_iterator()) >= 2;
  }
  n += std::distance(std::sregex_iterator(svg.begin(), svg.end(), path), std::sregex_iterator());
  return n;
}

// The ids of processes whose command line mentions `marker` (a run's own user-data-dir).
std::vector<int> processes_with(const std::string& marker) {
  std::vector<int> out;
  DIR* proc = opendir("/proc");
  if (!proc) return out;
  while (dirent* e = readdir(proc)) {
    const std::string name = e->d_name;
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string cmd = read("/proc/" + name + "/cmdline");  // empty once it has gone
    if (cmd.find(marker) != std::string::npos) out.push_back(std::stoi(name));
  }
  closedir(proc);
  return out;
}

struct Browser {
  int code = -1;
  std::string out;  // stdout and stderr: the log, and the DOM with --dump-dom
};

// Headless chromium on a page, bounded by timeout, with a profile, HOME and caches of its own
// that are removed after; whatever of it is still running after it exits is reported and ended.
Browser chromium(TempDir& dir, const std::string& page, const std::string& what) {
  const std::string profile = dir.file("chromium-" + std::to_string(getpid()) + "-" + what);
  fs::create_directories(profile + "/home");
  Browser b;
  auto r = sh("env HOME=" + profile + "/home XDG_CONFIG_HOME=" + profile +
              "/home XDG_CACHE_HOME=" + profile +
              "/home timeout -k 5 60 chromium --headless --no-sandbox --disable-gpu "
              "--no-first-run --disable-extensions --disable-breakpad --hide-scrollbars "
              "--enable-logging=stderr --v=0 --user-data-dir=" +
              profile + " " + what + " file://" + page);
  b.code = r.code;
  b.out = r.out;
  std::vector<int> left;
  for (int i = 0; i < 50; ++i) {  // its helpers end within moments of it
    left = processes_with(profile);
    if (left.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (int pid : left) kill(pid, SIGKILL);
  EXPECT_TRUE(left.empty()) << "chromium left " << left.size() << " process(es) behind";
  fs::remove_all(profile);
  return b;
}

// Lines of the browser's log that are console messages (an uncaught error, a failed load).
std::string console_lines(const std::string& log) {
  std::string out;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);)
    if (line.find(":CONSOLE") != std::string::npos || line.find("Uncaught") != std::string::npos)
      out += line + "\n";
  return out;
}

std::string scan_set(TempDir& dir, const std::string& name, int count, int seed) {
  const std::string path = dir.file(name);
  auto r =
      sh("timeout 60 " + cohort_bin() + " make-dataset scans --out " + path + " --count " +
         std::to_string(count) + " --size 24 --lesion-fraction 0.5 --seed " + std::to_string(seed));
  EXPECT_EQ(r.code, 0) << r.out;
  return path;
}

// The cheapest real training: smallcnn on scans of 24 px, 2 epochs, batch 8 per rank unless
// `extra` gives one.
std::string train(const std::string& train, const std::string& val, const std::string& extra) {
  return cohort_bin() + " train --model smallcnn --data " + train +
         (val.empty() ? "" : " --val " + val) +
         " --epochs 2 --image-size 24 --crop-scale 1 --lr 0.05 --workers 1 "
         "--threads 1 --log-every 100 " +
         (extra.find("--batch") == std::string::npos ? "--batch 8 " : "") + extra;
}

// One run and two (1 rank, then 2 ranks under cohort launch), drawn by cohort report and opened
// in chromium; cohort train --report draws the 1-rank run's page at its end.
TEST(Report, OneAndTwoRealRunsDrawnAndOpenedInABrowser) {
  TempDir dir;
  const std::string tr = scan_set(dir, "train", 64, 1), va = scan_set(dir, "val", 32, 2);
  auto one = sh("timeout 60 " + train(tr, va,
                                      "--batch 16 --json " + dir.file("one.json") + " --report " +
                                          dir.file("page-one")));
  ASSERT_EQ(one.code, 0) << one.out;
  EXPECT_NE(one.out.find("train: report in " + dir.file("page-one") +
                         "/index.html (7 plots, "
                         "with PNG copies)"),
            std::string::npos)
      << one.out;
  EXPECT_TRUE(fs::exists(dir.file("page-one/index.html")));
  auto two = sh("timeout 90 " + cohort_bin() + " launch --nproc-per-node 2 -- " +
                train(tr, va, "--json " + dir.file("two.json")));
  ASSERT_EQ(two.code, 0) << two.out;

  // One run: every plot as SVG and PNG; each PNG decodes and shows the run's colour.
  auto r1 = sh("timeout 60 " + cohort_bin() + " report " + dir.file("one.json") + " --out " +
               dir.file("r1"));
  ASSERT_EQ(r1.code, 0) << r1.out;
  EXPECT_NE(r1.out.find("(7 plots, 7 PNG copies)"), std::string::npos) << r1.out;
  for (const std::string& p : kPlots) {
    ASSERT_TRUE(fs::exists(dir.file("r1/" + p + ".svg"))) << p;
    const Image im = decode_png(dir.file("r1/" + p + ".png"));
    ASSERT_GT(im.width, 1000u) << p;  // drawn at twice the SVG's 760 px
    EXPECT_GT(ink(im), im.width * im.height / 100) << p << ": the PNG is blank";
    EXPECT_GT(near(im, "#4e79a7"), 100u) << p << ": the run's colour is not in the PNG";
  }
  EXPECT_NE(read(dir.file("r1/index.html")).find("One run: no scaling efficiency"),
            std::string::npos);

  // Two runs share each plot; the page states the scaling efficiency of 2 ranks against 1.
  auto r2 = sh("timeout 60 " + cohort_bin() + " report " + dir.file("one.json") + " " +
               dir.file("two.json") + " --out " + dir.file("r2"));
  ASSERT_EQ(r2.code, 0) << r2.out;
  const std::string html = read(dir.file("r2/index.html"));
  const nlohmann::json l1 = nlohmann::json::parse(read(dir.file("one.json")));
  const nlohmann::json l2 = nlohmann::json::parse(read(dir.file("two.json")));
  const double eff = (l2["summary"]["images_per_s"].get<double>() / 2) /
                     l1["summary"]["images_per_s"].get<double>();
  char expect[64];
  std::snprintf(expect, sizeof expect, "a scaling efficiency of %.1f%% against one", 100 * eff);
  EXPECT_NE(html.find(expect), std::string::npos) << expect << "\n" << html.substr(0, 3000);
  EXPECT_NE(html.find("two (2 ranks, ddp)"), std::string::npos);
  // Self-contained: nothing fetched from elsewhere (the only URL is SVG's namespace).
  EXPECT_EQ(count(html, "<script"), 0u);
  EXPECT_EQ(count(html, "<link"), 0u);
  EXPECT_EQ(count(html, "url("), 0u);
  EXPECT_EQ(count(html, "http"), count(html, "xmlns=\"http://www.w3.org/2000/svg\""));
  const std::vector<std::string> svgs = svgs_of(html);
  ASSERT_EQ(svgs.size(), kPlots.size());
  for (const std::string& s : svgs) {
    EXPECT_GE(data_marks(s), 1u) << s.substr(0, 200);
    EXPECT_EQ(s.find("No run in these logs"), std::string::npos) << s.substr(0, 200);
  }
  // Both runs in the loss plot (two lines) and 1 + 2 ranks in the memory plot.
  EXPECT_EQ(count(svgs[0], "<polyline"), 2u);
  EXPECT_NE(svgs[0].find("#f28e2b"), std::string::npos);
  EXPECT_EQ(count(svgs[6], ">rank 0<"), 2u);
  EXPECT_EQ(count(svgs[6], ">rank 1<"), 1u);

  // The browser: the detector sees a console error where there is one...
  write(dir.file("broken.html"), "<html><body><script>no_such_function();</script></body></html>");
  Browser control = chromium(dir, dir.file("broken.html"), "--dump-dom");
  EXPECT_NE(console_lines(control.out).find("no_such_function"), std::string::npos) << control.out;
  // ... and none on the report; the screenshot is drawn, with both runs' lines in it.
  const std::string shot = dir.file("shot.png");
  Browser b =
      chromium(dir, dir.file("r2/index.html"), "--window-size=900,4600 --screenshot=" + shot);
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_EQ(console_lines(b.out), "") << b.out;
  const Image im = decode_png(shot);
  ASSERT_EQ(im.width, 900u) << b.out;
  ASSERT_EQ(im.height, 4600u);
  EXPECT_GT(ink(im), static_cast<size_t>(im.width) * im.height / 50) << "the screenshot is blank";
  EXPECT_GT(near(im, "#4e79a7"), 2000u) << "run one's colour is missing from the screenshot";
  EXPECT_GT(near(im, "#f28e2b"), 2000u) << "run two's colour is missing from the screenshot";
  // The DOM the browser built: every plot an SVG element with its drawn marks.
  Browser dom = chromium(dir, dir.file("r2/index.html"), "--dump-dom");
  ASSERT_EQ(dom.code, 0) << dom.out;
  EXPECT_EQ(console_lines(dom.out), "") << dom.out;
  const std::vector<std::string> parsed = svgs_of(dom.out);
  ASSERT_EQ(parsed.size(), kPlots.size()) << dom.out.substr(0, 2000);
  for (size_t i = 0; i < parsed.size(); ++i)
    EXPECT_EQ(data_marks(parsed[i]), data_marks(svgs[i])) << kPlots[i];
}

// A bench train log has no loss, learning rate or validation, and a run without --val no
// validation: each plot says so, and draws what there is.
TEST(Report, WhatALogLacksIsSaidInThePlot) {
  TempDir dir;
  const std::string tr = scan_set(dir, "train", 32, 1);
  auto bench = sh("timeout 60 " + cohort_bin() +
                  " bench train --model smallcnn --batch 8 --image-size 24 --in-channels 1 "
                  "--num-classes 2 --steps 3 --warmup 1 --threads 1 --json " +
                  dir.file("bench.json"));
  ASSERT_EQ(bench.code, 0) << bench.out;
  auto noval = sh("timeout 60 " + train(tr, "", "--max-steps 3 --json " + dir.file("noval.json")));
  ASSERT_EQ(noval.code, 0) << noval.out;
  auto r = sh("timeout 60 " + cohort_bin() + " report " + dir.file("noval.json") + " " +
              dir.file("bench.json") + " --out " + dir.file("r"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string loss = read(dir.file("r/loss.svg")), acc = read(dir.file("r/val_accuracy.svg"));
  EXPECT_NE(loss.find("bench: no loss per step (a bench train log: synthetic data)"),
            std::string::npos)
      << loss;
  EXPECT_EQ(count(loss, "<polyline"), 1u);  // the training run's
  EXPECT_NE(acc.find("No run in these logs has validation accuracy"), std::string::npos) << acc;
  EXPECT_NE(acc.find("noval: no validation in this run (trained without --val)"), std::string::npos)
      << acc;
  EXPECT_NE(acc.find("bench: a bench train log has no validation"), std::string::npos) << acc;
  const std::string steps = read(dir.file("r/step_breakdown.svg"));
  EXPECT_NE(steps.find("synthetic data (bench train), so no data wait"), std::string::npos);
  EXPECT_EQ(count(steps, "class=\"bar\""), 3u);  // compute for both; data wait for noval's
  EXPECT_GE(data_marks(read(dir.file("r/images_per_s.svg"))), 2u);
  EXPECT_GE(data_marks(read(dir.file("r/memory.svg"))), 2u);
}

// A long run (50,000 steps) is drawn as what each pixel column shows, its spikes kept: the page
// stays small, and a single step's loss spike still reaches the top of the plot.
TEST(Report, ALongRunIsDrawnAsItsEnvelope) {
  TempDir dir;
  const std::string tr = scan_set(dir, "train", 32, 1);
  auto t = sh("timeout 60 " + train(tr, "", "--max-steps 2 --json " + dir.file("short.json")));
  ASSERT_EQ(t.code, 0) << t.out;
  nlohmann::json log = nlohmann::json::parse(read(dir.file("short.json")));
  nlohmann::json steps = nlohmann::json::array();
  for (int i = 1; i <= 50000; ++i) {
    nlohmann::json s = log["steps"][0];
    s["step"] = i;
    s["loss"] = i == 31234 ? 10.0 : 1.0 + 0.1 * ((i * 7919) % 13) / 13.0;
    steps.push_back(s);
  }
  log["steps"] = steps;
  write(dir.file("long.json"), log.dump());
  auto r = sh("timeout 60 " + cohort_bin() + " report " + dir.file("long.json") + " --out " +
              dir.file("r"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string loss = read(dir.file("r/loss.svg"));
  EXPECT_LT(loss.size(), 100000u);
  static const std::regex point(R"((-?[0-9.]+),(-?[0-9.]+))");
  size_t n = 0;
  double top = 1e9;
  for (auto it = std::sregex_iterator(loss.begin(), loss.end(), point);
       it != std::sregex_iterator(); ++it, ++n)
    top = std::min(top, std::stod((*it)[2]));
  EXPECT_GT(n, 500u);
  EXPECT_LT(n, 4 * 760u);
  EXPECT_LT(top, 60.0) << "the spike at step 31234 was dropped";  // the plot's top is y = 46
}

// A missing file, a file that is not JSON, a missing field and a mistyped one: each an error
// that names the file (and the field), with exit status 1, never a crash.
TEST(Report, BadLogsAreErrorsNamingTheFileAndField) {
  TempDir dir;
  const std::string tr = scan_set(dir, "train", 32, 1);
  const std::string good = dir.file("good.json");
  auto t = sh("timeout 60 " + train(tr, "", "--max-steps 2 --json " + good));
  ASSERT_EQ(t.code, 0) << t.out;
  nlohmann::json log = nlohmann::json::parse(read(good));
  auto report = [&](const std::string& file) {
    return sh("timeout 60 " + cohort_bin() + " report " + file + " --out " + dir.file("out"));
  };
  struct Case {
    std::string name, text, says;
  };
  nlohmann::json no_images = log, bad_world = log, bad_step = log, bench_no_ms = log;
  no_images["summary"].erase("images_per_s");
  bad_world["world"] = "two";
  bad_step["steps"][1]["loss"] = "high";
  const std::vector<Case> cases = {
      {"truncated.json", log.dump().substr(0, 100), "is not valid JSON"},
      {"no_images.json", no_images.dump(),
       "field 'summary.images_per_s' is missing (a cohort train --json log has it)"},
      {"bad_world.json", bad_world.dump(),
       "field 'world' is a string (\"two\"), expected a number"},
      {"bad_step.json", bad_step.dump(), "field 'steps[1].loss' is a string (\"high\")"},
      {"other.json", R"({"rows": []})", "not a cohort train or cohort bench train --json log"},
      {"array.json", "[1, 2]", "the log is an array, expected an object"},
  };
  for (const Case& c : cases) {
    write(dir.file(c.name), c.text);
    auto r = report(dir.file(c.name));
    EXPECT_EQ(r.code, 1) << c.name << ": " << r.out;
    EXPECT_NE(r.out.find(dir.file(c.name)), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.name << ": " << r.out;
  }
  auto missing = report(dir.file("absent.json"));
  EXPECT_EQ(missing.code, 1) << missing.out;
  EXPECT_NE(missing.out.find("cannot read the log " + dir.file("absent.json")), std::string::npos)
      << missing.out;
  EXPECT_FALSE(fs::exists(dir.file("out/index.html")));
  // And the good log draws.
  EXPECT_EQ(report(good).code, 0);
}

}  // namespace
