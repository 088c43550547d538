// The net plugin between two network namespaces joined by veth pairs: a real (virtual) network with its own
// addresses instead of loopback. One net_peer runs in each namespace (ip netns exec); first over one rail, then over
// two rails with OPTIFLOW_NET_STRIPE=1, where the interface counters show that both rails carried the data. The
// namespaces (and with them the veths) are removed at the end, also when a check fails. Skipped, with the reason,
// where namespaces cannot be created (not root, no CAP_NET_ADMIN, no ip).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const std::string kPeer = OPTIFLOW_NET_PEER;
const std::string kPlugin = OPTIFLOW_NET_PLUGIN;

// Runs a shell command (bounded by `timeout`), returns its exit status and output.
int sh(const std::string& cmd, std::string* out = nullptr) {
  std::string full = "timeout 20 " + cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (p == nullptr) return -1;
  std::string text;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) text += buf;
  const int status = pclose(p);
  if (out != nullptr) *out = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

using Process = optiflow::testsupport::ChildProcess;
using optiflow::testsupport::kTimedOut;
using optiflow::testsupport::TempDir;

// Two namespaces, rails added on demand: rail i is veth pair (va<i> in A, 10.77.<i+1>.1/24) <-> (vb<i> in B,
// 10.77.<i+1>.2/24). Interface names are per namespace, so fixed names are fine; namespace names carry the pid.
class TwoNamespaces {
 public:
  TwoNamespaces() : a_("optiflow-a-" + std::to_string(getpid())), b_("optiflow-b-" + std::to_string(getpid())) {}
  ~TwoNamespaces() {
    for (const std::string& tmp : tmpLinks_) sh("ip link del " + tmp);  // a veth that never moved
    if (created_) {
      sh("ip netns del " + a_);
      sh("ip netns del " + b_);
    }
  }
  TwoNamespaces(const TwoNamespaces&) = delete;
  TwoNamespaces& operator=(const TwoNamespaces&) = delete;

  // "" when ready; else why namespaces are unavailable here.
  std::string create() {
    if (geteuid() != 0) return "not root (network namespaces need CAP_NET_ADMIN)";
    std::string out;
    if (sh("ip -V", &out) != 0) return "no ip command: " + out;
    sh("ip netns del " + a_);
    sh("ip netns del " + b_);
    if (sh("ip netns add " + a_, &out) != 0) return "ip netns add failed: " + out;
    created_ = true;
    if (sh("ip netns add " + b_, &out) != 0) return "ip netns add failed: " + out;
    for (const std::string& ns : {a_, b_}) {
      if (sh("ip -n " + ns + " link set lo up", &out) != 0) return "lo up: " + out;
    }
    return "";
  }

  ::testing::AssertionResult addRail(int i) {
    const std::string va = "va" + std::to_string(i), vb = "vb" + std::to_string(i);
    // Created in the root namespace under unique names, then moved and renamed.
    const std::string ta = "ofa" + std::to_string(getpid() % 100000) + "x" + std::to_string(i);
    const std::string tb = "ofb" + std::to_string(getpid() % 100000) + "x" + std::to_string(i);
    const std::string subnet = "10.77." + std::to_string(i + 1);
    tmpLinks_.push_back(ta);
    const std::vector<std::string> cmds = {
        "ip link add " + ta + " type veth peer name " + tb,
        "ip link set " + ta + " netns " + a_ + " name " + va,
        "ip link set " + tb + " netns " + b_ + " name " + vb,
        "ip -n " + a_ + " addr add " + subnet + ".1/24 dev " + va,
        "ip -n " + b_ + " addr add " + subnet + ".2/24 dev " + vb,
        "ip -n " + a_ + " link set " + va + " up",
        "ip -n " + b_ + " link set " + vb + " up",
    };
    for (const std::string& c : cmds) {
      std::string out;
      if (sh(c, &out) != 0) return ::testing::AssertionFailure() << c << ": " << out;
    }
    tmpLinks_.pop_back();
    return ::testing::AssertionSuccess();
  }

  // A counter of interface `ifname` in namespace ns (rx_bytes, tx_bytes).
  std::uint64_t counter(const std::string& ns, const std::string& ifname, const std::string& which) const {
    std::string out;
    if (sh("ip netns exec " + ns + " cat /sys/class/net/" + ifname + "/statistics/" + which, &out) != 0) return 0;
    return std::strtoull(out.c_str(), nullptr, 10);
  }

  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }

 private:
  std::string a_, b_;
  bool created_ = false;
  std::vector<std::string> tmpLinks_;
};

// A ring of two across the namespaces: the rank in A and the rank in B both listen and connect.
void runPair(const TwoNamespaces& ns, const TempDir& dir, const std::vector<std::pair<std::string, std::string>>& envA,
             const std::vector<std::pair<std::string, std::string>>& envB, const std::vector<std::string>& extra) {
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> argv = {"ip",
                                     "netns",
                                     "exec",
                                     r == 0 ? ns.a() : ns.b(),
                                     kPeer,
                                     "--plugin",
                                     kPlugin,
                                     "--rank",
                                     std::to_string(r),
                                     "--recv-from",
                                     std::to_string(1 - r),
                                     "--listen-out",
                                     dir.path().string() + "/h" + std::to_string(r),
                                     "--connect-in",
                                     dir.path().string() + "/h" + std::to_string(1 - r),
                                     "--deadline-s",
                                     "60"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    ranks.push_back(
        std::make_unique<Process>(argv, r == 0 ? envA : envB, dir.path().string() + "/rank" + std::to_string(r)));
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[static_cast<std::size_t>(r)]->wait(90s), 0) << "rank " << r << "\n"
                                                                << ranks[static_cast<std::size_t>(r)]->dump();
    EXPECT_NE(ranks[static_cast<std::size_t>(r)]->out().find("DONE"), std::string::npos);
  }
}

std::vector<std::pair<std::string, std::string>> env(const std::string& ifnames,
                                                     std::vector<std::pair<std::string, std::string>> more = {}) {
  std::vector<std::pair<std::string, std::string>> e = {{"OPTIFLOW_NET_TRANSPORT", "tcp"},
                                                        {"OPTIFLOW_NET_IFNAMES", ifnames},
                                                        {"OPTIFLOW_NAMESPACE", "netns-" + std::to_string(getpid())}};
  e.insert(e.end(), more.begin(), more.end());
  return e;
}

TEST(NetNamespaces, OneRailThenTwoStripedRails) {
  TwoNamespaces ns;
  if (const std::string why = ns.create(); !why.empty()) GTEST_SKIP() << why;
  ASSERT_TRUE(ns.addRail(0));
  TempDir dir;
  {
    SCOPED_TRACE("one rail");
    runPair(ns, dir, env("va0"), env("vb0"), {"--sizes", "0,1,4097,1M,16M", "--repeat", "2"});
  }
  if (HasFailure()) return;

  ASSERT_TRUE(ns.addRail(1));
  TempDir dir2;
  const std::uint64_t rx0 = ns.counter(ns.a(), "va0", "rx_bytes");
  const std::uint64_t rx1 = ns.counter(ns.a(), "va1", "rx_bytes");
  {
    SCOPED_TRACE("two rails, striped");
    const std::vector<std::pair<std::string, std::string>> stripe = {{"OPTIFLOW_NET_STRIPE", "1"},
                                                                     {"OPTIFLOW_NET_MIN_STRIPE_BYTES", "64K"}};
    runPair(ns, dir2, env("va0,va1", stripe), env("vb0,vb1", stripe),
            {"--sizes", "1,4097,1M,16M,64M", "--repeat", "2"});
  }
  // B sent 2 x 81 MiB to A; with equal rail weights each rail carried a large share of it.
  const std::uint64_t d0 = ns.counter(ns.a(), "va0", "rx_bytes") - rx0;
  const std::uint64_t d1 = ns.counter(ns.a(), "va1", "rx_bytes") - rx1;
  const std::uint64_t sent = 2 * (1 + 4097 + (1u << 20) + (16u << 20) + (64u << 20));
  std::printf("bytes received in A: va0 %llu, va1 %llu (B sent %llu)\n", static_cast<unsigned long long>(d0),
              static_cast<unsigned long long>(d1), static_cast<unsigned long long>(sent));
  EXPECT_GT(d0, sent / 5) << "rail 0 received " << d0 << " of " << sent << " bytes";
  EXPECT_GT(d1, sent / 5) << "rail 1 received " << d1 << " of " << sent << " bytes";
  EXPECT_GE(d0 + d1, sent);
}

}  // namespace
