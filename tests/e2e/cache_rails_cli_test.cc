// `optiflow cache rails [set]` and the network part of `optiflow cache show` as a user runs them, on a real segment
// under /dev/shm whose net counters the test fills through the library (as the net plugin would).
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "optiflow/schedcache/layout.h"
#include "optiflow/schedcache/reader.h"
#include "optiflow/schedcache/writer.h"

#include "run_command.h"

namespace {

namespace fs = std::filesystem;
using optiflow::testsupport::slurp;
using CliResult = optiflow::testsupport::CommandResult;

namespace sc = optiflow::schedcache;
using nlohmann::json;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

void add(std::uint64_t* field, std::uint64_t value) {
  std::atomic_ref<std::uint64_t>(*field).fetch_add(value, std::memory_order_relaxed);
}

class RailsCli : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    ns_ = fmt::format("e2e-rails-{}-{}", ::getpid(), counter++);
    dir_ = fs::temp_directory_path() / ns_;
    fs::create_directories(dir_);
    sc::Writer::remove(ns_, nullptr);
  }
  void TearDown() override {
    sc::Writer::remove(ns_, nullptr);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  CliResult cache(const std::string& args) {
    return optiflow::testsupport::runCommand(fmt::format("{} cache {} --namespace {}", OPTIFLOW_CLI, args, ns_), dir_);
  }

  std::string ns_;
  fs::path dir_;
};

TEST_F(RailsCli, SetThenShowWeights) {
  CliResult r = cache("rails");
  EXPECT_EQ(r.rc, 0) << r.all();
  EXPECT_TRUE(contains(r.out, "equal share")) << r.out;

  r = cache("rails set eth0=3 eth1=1");
  ASSERT_EQ(r.rc, 0) << r.all();
  r = cache("rails");
  ASSERT_EQ(r.rc, 0) << r.all();
  EXPECT_TRUE(contains(r.out, "75.0%")) << r.out;
  EXPECT_TRUE(contains(r.out, "25.0%")) << r.out;

  // eth0 not listed: it keeps its record with weight 0.
  ASSERT_EQ(cache("rails set eth1=2 ib0=2").rc, 0);
  auto reader = sc::Reader::attach(ns_, nullptr);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->railIndex("eth0"), 0);
  EXPECT_EQ(reader->railWeight(0), 0u);
  EXPECT_EQ(reader->railWeight(reader->railIndex("eth1")), 2u);
  EXPECT_EQ(reader->railWeight(reader->railIndex("ib0")), 2u);
}

TEST_F(RailsCli, MalformedArgumentsAreNamedAndChangeNothing) {
  ASSERT_EQ(cache("rails set eth0=3").rc, 0);
  const struct {
    const char* arg;
    const char* says;
  } cases[] = {
      {"eth1", "expected NAME=WEIGHT"},
      {"eth1=x", "expected an integer from 0 to 1000000"},
      {"eth1=-1", "expected an integer from 0 to 1000000"},
      {"eth1=1000001", "expected an integer from 0 to 1000000"},
      {"=4", "expected 1 to 15 characters"},
      {"abcdefghijklmnop=1", "expected 1 to 15 characters"},
      {"eth/1=1", "expected 1 to 15 characters"},
  };
  for (const auto& c : cases) {
    const CliResult r = cache(fmt::format("rails set eth0=1 '{}'", c.arg));
    EXPECT_EQ(r.rc, 2) << c.arg << ": " << r.all();
    EXPECT_TRUE(contains(r.err, fmt::format("\"{}\" (argument 2)", c.arg))) << r.err;
    EXPECT_TRUE(contains(r.err, c.says)) << r.err;
    EXPECT_TRUE(contains(r.err, "no rail weight was changed")) << r.err;
  }
  const CliResult twice = cache("rails set eth1=1 eth1=2");
  EXPECT_EQ(twice.rc, 2);
  EXPECT_TRUE(contains(twice.err, "given twice")) << twice.err;
  auto reader = sc::Reader::attach(ns_, nullptr);
  ASSERT_NE(reader, nullptr);
  ASSERT_EQ(reader->railWeights().size(), 1u);
  EXPECT_EQ(reader->railWeight(0), 3u);
}

TEST_F(RailsCli, ShowReportsNetworkCountersAndThroughput) {
  ASSERT_EQ(cache("rails set eth0=3 eth1=1").rc, 0);
  {
    auto reader = sc::Reader::attach(ns_, nullptr);
    ASSERT_NE(reader, nullptr);
    sc::NetCounters* nic = reader->netNic("eth0");
    sc::NetCounters* peer = reader->netPeer("10.0.0.2");
    ASSERT_NE(nic, nullptr);
    ASSERT_NE(peer, nullptr);
    add(&nic->bytesSent, 25'000'000'000);
    add(&nic->sendBusyNs, 2'000'000'000);  // 12.5 GB/s
    add(&nic->msgsSent, 100);
    add(&nic->sizeLog2[20], 100);
    add(&nic->stalls, 4);
    add(&peer->errors, 2);
  }
  CliResult r = cache("show");
  ASSERT_EQ(r.rc, 0) << r.all();
  EXPECT_TRUE(contains(r.out, "network")) << r.out;
  EXPECT_TRUE(contains(r.out, "12.50")) << r.out;
  EXPECT_TRUE(contains(r.out, "10.0.0.2")) << r.out;
  EXPECT_TRUE(contains(r.out, "75.0%")) << r.out;

  r = cache("show --json");
  ASSERT_EQ(r.rc, 0) << r.all();
  const json j = json::parse(r.out);
  ASSERT_EQ(j["rails"].size(), 2u);
  EXPECT_EQ(j["rails"][0]["name"], "eth0");
  EXPECT_EQ(j["rails"][0]["weight"], 3);
  ASSERT_EQ(j["net"]["nics"].size(), 1u);
  const json& nic = j["net"]["nics"][0];
  EXPECT_EQ(nic["name"], "eth0");
  EXPECT_EQ(nic["bytes_sent"], 25'000'000'000ULL);
  EXPECT_EQ(nic["send_busy_ns"], 2'000'000'000ULL);
  EXPECT_DOUBLE_EQ(nic["send_gbps"].get<double>(), 12.5);
  EXPECT_TRUE(nic["recv_gbps"].is_null());
  EXPECT_EQ(nic["stalls"], 4);
  ASSERT_EQ(nic["sent_by_size"].size(), 1u);
  EXPECT_EQ(nic["sent_by_size"][0]["bucket"], 20);
  ASSERT_EQ(j["net"]["peers"].size(), 1u);
  EXPECT_EQ(j["net"]["peers"][0]["errors"], 2);
}

}  // namespace
