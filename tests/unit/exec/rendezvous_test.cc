// The launcher's environment and the rendezvous of optiflow-bench's processes (threads stand in for processes):
// every rank gets rank 0's blob over TCP or through a shared directory, and every failure is an error that says
// who was waited for, within the deadline given.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "optiflow/exec/rendezvous.h"
#include "temp_dir.h"

#include "ports.h"

namespace optiflow::exec {
namespace {

using std::chrono::milliseconds;

core::Result<LaunchInfo> fromMap(const std::map<std::string, std::string>& env) {
  return launchInfoFromEnv([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(LaunchEnv, EveryLauncherIsRead) {
  auto none = fromMap({});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->rank, 0);
  EXPECT_EQ(none->size, 1);
  EXPECT_EQ(none->source, "none");
  auto ompi = fromMap({{"OMPI_COMM_WORLD_RANK", "3"},
                       {"OMPI_COMM_WORLD_SIZE", "8"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                       {"RANK", "7"},
                       {"WORLD_SIZE", "9"}});
  ASSERT_TRUE(ompi.ok());
  EXPECT_EQ(ompi->rank, 3);  // Open MPI's variables win over torchrun's
  EXPECT_EQ(ompi->size, 8);
  EXPECT_EQ(ompi->localRank, 1);
  auto slurm =
      fromMap({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "5"}, {"SLURM_JOB_ID", "4242"}});
  ASSERT_TRUE(slurm.ok());
  EXPECT_EQ(slurm->rank, 5);
  EXPECT_EQ(slurm->size, 16);
  EXPECT_EQ(slurm->jobKey, "4242");
  auto torch = fromMap({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}});
  ASSERT_TRUE(torch.ok());
  EXPECT_EQ(torch->rank, 1);
  EXPECT_EQ(torch->source, "RANK/WORLD_SIZE");
}

TEST(LaunchEnv, BadValuesNameTheVariable) {
  for (const auto& [env, fragment] : std::vector<std::pair<std::map<std::string, std::string>, std::string>>{
           {{{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK='x'"},
           {{{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "from 0 to 1"},
           {{{"RANK", "0"}}, "WORLD_SIZE is not"},
           {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}}, "SLURM_NTASKS='0'"},
           {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "-1"}}, "LOCAL_RANK='-1'"},
       }) {
    auto r = fromMap(env);
    ASSERT_FALSE(r.ok()) << fragment;
    EXPECT_NE(r.error().message.find(fragment), std::string::npos) << r.error().message;
  }
}

TEST(HostPortText, ParsesAndRefuses) {
  auto a = parseHostPort("node01:29500");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "node01");
  EXPECT_EQ(a->port, 29500);
  auto b = parseHostPort("[::1]:80");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "::1");
  for (const char* bad : {"node01", "node01:", ":80", "node01:0", "node01:65536", "node01:http", "[::1]80"}) {
    auto r = parseHostPort(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.error().message.find("expected host:port"), std::string::npos) << r.error().message;
    }
  }
}

TEST(Rendezvous, EveryRankGetsRankZerosBlobOverTcp) {
  const HostPort at{"127.0.0.1", testsupport::unusedPort()};
  constexpr int kRanks = 6;
  const Blob id = {1, 2, 3, 4, 5, 250};
  std::vector<core::Result<Blob>> got(kRanks, core::Diagnostic{});
  {
    std::vector<std::jthread> ranks;
    // The others start first: they retry until rank 0 listens.
    for (int r = kRanks - 1; r >= 0; --r) {
      ranks.emplace_back(
          [&, r] { got[r] = exchangeOverTcp(at, r, kRanks, r == 0 ? id : Blob{}, milliseconds(30000)); });
    }
  }
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(got[r].ok()) << r << ": " << got[r].error().message;
    EXPECT_EQ(*got[r], id) << r;
  }
}

TEST(Rendezvous, NoRankZeroIsATimeoutNamingTheAddress) {
  const HostPort at{"127.0.0.1", testsupport::unusedPort()};
  const auto start = std::chrono::steady_clock::now();
  auto r = exchangeOverTcp(at, 1, 2, {}, milliseconds(300));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no rank 0 answered at 127.0.0.1:"), std::string::npos) << r.error().message;
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(300));
}

TEST(Rendezvous, MissingRanksAreNamedByRankZero) {
  const HostPort at{"127.0.0.1", testsupport::unusedPort()};
  std::optional<core::Result<Blob>> one;
  std::optional<core::Result<Blob>> zero;
  {
    // Rank 0's deadline is what ends the test; it is generous so that rank 1 joins first on a loaded machine.
    std::jthread r0([&] { zero = exchangeOverTcp(at, 0, 4, {9}, milliseconds(5000)); });
    std::jthread r1([&] { one = exchangeOverTcp(at, 1, 4, {}, milliseconds(10000)); });
  }
  ASSERT_TRUE(one && one->ok()) << (one && !one->ok() ? one->error().message : "");
  ASSERT_TRUE(zero && !zero->ok());
  EXPECT_NE(zero->error().message.find("2 of 4 ranks joined"), std::string::npos) << zero->error().message;
  EXPECT_NE(zero->error().message.find("missing: 2, 3"), std::string::npos) << zero->error().message;
}

TEST(Rendezvous, SomethingElseOnThePortIsRefused) {
  // A listener that answers with bytes that are not ours.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ASSERT_EQ(::listen(fd, 4), 0);
  std::jthread server([fd] {
    const int c = ::accept(fd, nullptr, nullptr);
    if (c < 0) return;
    const char junk[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
    (void)!::write(c, junk, sizeof junk);
    char buf[64];
    (void)!::read(c, buf, sizeof buf);
    ::close(c);
  });
  auto r = exchangeOverTcp({"127.0.0.1", ntohs(addr.sin_port)}, 1, 2, {}, milliseconds(5000));
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("not an optiflow-bench rendezvous"), std::string::npos) << r.error().message;
}

TEST(Rendezvous, ThroughASharedDirectory) {
  testsupport::TempDir dir("rdv");
  const Blob id(128, 7);
  std::vector<core::Result<Blob>> got(3, core::Diagnostic{});
  {
    std::vector<std::jthread> ranks;
    for (int r = 2; r >= 0; --r) {
      ranks.emplace_back([&, r] {
        got[r] = exchangeOverFile(dir.path().string(), "job:17", r, r == 0 ? id : Blob{}, milliseconds(30000));
      });
    }
  }
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].error().message;
    EXPECT_EQ(*got[r], id);
  }
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "optiflow-bench-job_17.id"));
  removeRendezvousFile(dir.path().string(), "job:17");
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "optiflow-bench-job_17.id"));
}

TEST(Rendezvous, DirectoryErrors) {
  testsupport::TempDir dir("rdv");
  auto missing = exchangeOverFile(dir.file("nope"), "k", 1, {}, milliseconds(100));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("not a directory"), std::string::npos);
  auto late = exchangeOverFile(dir.path().string(), "k", 1, {}, milliseconds(200));
  ASSERT_FALSE(late.ok());
  EXPECT_NE(late.error().message.find("rank 0 wrote no"), std::string::npos) << late.error().message;
  dir.write("optiflow-bench-k.id", "garbage, not an id");
  auto garbage = exchangeOverFile(dir.path().string(), "k", 1, {}, milliseconds(5000));
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.error().message.find("not an optiflow-bench rendezvous file"), std::string::npos);
}

}  // namespace
}  // namespace optiflow::exec
