// The net plugin across processes on loopback: net_peer processes (each dlopens libnccl-net-optiflow.so like NCCL)
// exchange handles through files in a temp dir and run scripted transfers with every byte checked; 2 and 4 ranks,
// sizes from 0 B to 256 MiB, 32 requests in flight, grouped receives, mixed ABI versions. Faults: a peer SIGKILLed
// mid-stream, a connection reset by a raw socket after a valid hello, a raw socket that sends garbage after a valid
// hello. Every wait has a deadline, and a survivor must report the error (exit 0 with --expect-error) rather than hang.
// The deadlines are generous (a loaded CI machine, a sanitizer build) and add up to less than ctest's TIMEOUT (120 s,
// tests/multiproc/CMakeLists.txt), so a hang fails here with the processes' output rather than as a ctest timeout.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "optiflow/net/wire.h"

#include "child_process.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const std::string kPeer = OPTIFLOW_NET_PEER;
const std::string kPlugin = OPTIFLOW_NET_PLUGIN;

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using Process = optiflow::testsupport::ChildProcess;
using optiflow::testsupport::kTimedOut;
using optiflow::testsupport::TempDir;

std::vector<std::pair<std::string, std::string>> loopbackEnv() {
  return {{"OPTIFLOW_NET_TRANSPORT", "tcp"},
          {"OPTIFLOW_NET_IFNAMES", "lo"},
          {"OPTIFLOW_NAMESPACE", "netmp-" + std::to_string(getpid())}};
}

// A ring of n peers: rank r listens (handle file h<r>) and connects to rank (r+1)%n; it receives from r-1.
std::vector<std::unique_ptr<Process>> startRing(const TempDir& dir, int n, const std::vector<std::string>& extra,
                                                const std::vector<int>& abis = {}) {
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv = {kPeer,
                                     "--plugin",
                                     kPlugin,
                                     "--abi",
                                     std::to_string(abis.empty() ? 12 : abis[static_cast<std::size_t>(r)]),
                                     "--rank",
                                     std::to_string(r),
                                     "--recv-from",
                                     std::to_string((r + n - 1) % n),
                                     "--listen-out",
                                     dir.path().string() + "/h" + std::to_string(r),
                                     "--connect-in",
                                     dir.path().string() + "/h" + std::to_string((r + 1) % n)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    ranks.push_back(std::make_unique<Process>(argv, loopbackEnv(), dir.path().string() + "/rank" + std::to_string(r)));
  }
  return ranks;
}

void expectAllSucceed(std::vector<std::unique_ptr<Process>>& ranks, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const int code = ranks[r]->wait(left > 0ms ? left : 1ms);
    EXPECT_EQ(code, 0) << "rank " << r << "\n" << ranks[r]->dump();
    EXPECT_NE(ranks[r]->out().find("DONE"), std::string::npos) << ranks[r]->dump();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Data

TEST(NetMultiproc, TwoRanksBothDirectionsEverySize) {
  TempDir dir;
  auto ranks = startRing(dir, 2, {"--sizes", "0,1,4097,1M,64M", "--deadline-s", "60"});
  expectAllSucceed(ranks, 90s);
}

TEST(NetMultiproc, OneMessageOf256MiB) {
  TempDir dir;
  const std::string h = dir.path().string() + "/h0";
  std::vector<std::unique_ptr<Process>> ranks;
  ranks.push_back(
      std::make_unique<Process>(std::vector<std::string>{kPeer, "--plugin", kPlugin, "--rank", "0", "--recv-from", "1",
                                                         "--listen-out", h, "--sizes", "256M", "--deadline-s", "90"},
                                loopbackEnv(), dir.path().string() + "/rank0"));
  ranks.push_back(
      std::make_unique<Process>(std::vector<std::string>{kPeer, "--plugin", kPlugin, "--rank", "1", "--connect-in", h,
                                                         "--sizes", "256M", "--deadline-s", "90"},
                                loopbackEnv(), dir.path().string() + "/rank1"));
  expectAllSucceed(ranks, 105s);  // the ranks' own 90 s deadline ends a hang first; under ctest's 120 s
  EXPECT_NE(ranks[0]->out().find("bytes=268435456"), std::string::npos) << ranks[0]->dump();
}

TEST(NetMultiproc, FourRankRing) {
  TempDir dir;
  auto ranks = startRing(dir, 4, {"--sizes", "0,1,4097,1M,8M", "--repeat", "2", "--deadline-s", "60"});
  expectAllSucceed(ranks, 90s);
}

// NCCL 2.24 (v9) on one side, 2.30 (v12) on the other, 2.26/2.28 in between: the wire does not depend on the ABI.
TEST(NetMultiproc, MixedAbiVersionsInteroperate) {
  TempDir dir;
  auto ranks = startRing(dir, 4, {"--sizes", "1,4097,1M", "--deadline-s", "60"}, {9, 10, 11, 12});
  expectAllSucceed(ranks, 90s);
}

TEST(NetMultiproc, ThirtyTwoRequestsInFlight) {
  TempDir dir;
  auto ranks = startRing(
      dir, 2, {"--sizes", "4097,65536,1,0,300000", "--repeat", "40", "--inflight", "32", "--deadline-s", "60"});
  expectAllSucceed(ranks, 90s);
}

TEST(NetMultiproc, GroupedReceivesOfEightWithDistinctTags) {
  TempDir dir;
  auto ranks = startRing(dir, 2,
                         {"--sizes", "1,100,4097,65536,0,3,1M,17", "--repeat", "6", "--group", "8", "--inflight", "4",
                          "--deadline-s", "60"});
  expectAllSucceed(ranks, 90s);
}

// ---------------------------------------------------------------------------------------------------------------
// Faults: the survivor's call fails (with a log line); nothing hangs or crashes

// net_peer printed "EXPECTED-ERROR <call> 6": a data-path call returned ncclRemoteError.
bool remoteError(const std::string& out) {
  const std::size_t at = out.find("EXPECTED-ERROR ");
  if (at == std::string::npos) return false;
  const std::string line = out.substr(at, out.find('\n', at) - at);
  return line.size() > 2 && line.compare(line.size() - 2, 2, " 6") == 0;
}

struct KillCase {
  const char* name;
  bool killSender;  // else the receiver dies
};

class PeerKilled : public ::testing::TestWithParam<KillCase> {};

TEST_P(PeerKilled, SurvivorReportsAnErrorWithinSeconds) {
  TempDir dir;
  const std::string h = dir.path().string() + "/h0";
  const bool killSender = GetParam().killSender;
  std::vector<std::string> recvArgs = {kPeer,         "--plugin", kPlugin,        "--rank", "0",
                                       "--recv-from", "1",        "--listen-out", h,        "--sizes",
                                       "64M",         "--stream", "--deadline-s", "60"};
  std::vector<std::string> sendArgs = {kPeer,     "--plugin", kPlugin,    "--rank",       "1", "--connect-in", h,
                                       "--sizes", "64M",      "--stream", "--deadline-s", "60"};
  (killSender ? recvArgs : sendArgs).push_back("--expect-error");
  Process receiver(recvArgs, loopbackEnv(), dir.path().string() + "/recv");
  Process sender(sendArgs, loopbackEnv(), dir.path().string() + "/send");
  // Data is flowing: the victim is mid-stream (64 MiB messages back to back) when it dies.
  ASSERT_TRUE(receiver.waitForOutput("FIRST-RECEIVED", 30s)) << receiver.dump() << sender.dump();
  Process& victim = killSender ? sender : receiver;
  Process& survivor = killSender ? receiver : sender;
  victim.kill(SIGKILL);
  EXPECT_EQ(victim.wait(20s), 128 + SIGKILL);
  // A survivor that hangs fails either way: by its own --deadline-s (exit 124) or by this wait (kTimedOut). Worst case
  // 30 + 20 + 45 s, under ctest's 120 s.
  const auto t0 = Clock::now();
  const int code = survivor.wait(45s);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(code, 0) << "the survivor must see an error (exit 0 with --expect-error), not hang or crash; exit " << code
                     << " after " << seconds << " s\n"
                     << survivor.dump();
  // ncclRemoteError (6): the peer is gone; from test (or isend/irecv posting on a dead connection).
  EXPECT_TRUE(remoteError(survivor.out())) << survivor.dump();
  EXPECT_NE(survivor.err().find("[plugin WARN] OptiFlow/Net:"), std::string::npos)
      << "the error comes with a log line\n"
      << survivor.dump();
}

INSTANTIATE_TEST_SUITE_P(Net, PeerKilled,
                         ::testing::Values(KillCase{"SenderKilled", true}, KillCase{"ReceiverKilled", false}),
                         [](const ::testing::TestParamInfo<KillCase>& p) { return std::string(p.param.name); });

// A raw TCP client that speaks a valid hello for the handle a net_peer listener wrote.
class RawConnector {
 public:
  bool connectTo(const std::string& handleFile, std::string* error) {
    std::string hex;
    const auto deadline = Clock::now() + 30s;
    while ((hex = readFile(handleFile)).size() < 256) {
      if (Clock::now() > deadline) {
        *error = "no handle in " + handleFile;
        return false;
      }
      std::this_thread::sleep_for(5ms);
    }
    std::uint8_t bytes[optiflow::net::kHandleBytes];
    for (std::size_t i = 0; i < sizeof(bytes); ++i)
      bytes[i] = static_cast<std::uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    optiflow::net::wire::TcpHandle handle;
    if (!optiflow::net::wire::decodeTcpHandle(bytes, &handle, error)) return false;
    if (handle.railCount != 1 || handle.rails[0].family != AF_INET) {
      *error = "expected one IPv4 rail on lo";
      return false;
    }
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(handle.rails[0].port);
    std::memcpy(&addr.sin_addr, handle.rails[0].addr, 4);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      *error = std::string("connect: ") + std::strerror(errno);
      return false;
    }
    optiflow::net::wire::Hello hello;
    hello.buildId = optiflow::net::wire::buildId();
    hello.listenId = handle.listenId;
    hello.connId = 0x5eed0000c0ffeeull;
    hello.streamIndex = 0;
    hello.streamCount = handle.rails[0].streams;
    std::uint8_t buf[optiflow::net::wire::kHelloBytes];
    optiflow::net::wire::encodeHello(hello, buf);
    return sendAll(buf, sizeof(buf), error);
  }
  bool sendAll(const void* data, std::size_t n, std::string* error) {
    const auto* p = static_cast<const std::uint8_t*>(data);
    while (n > 0) {
      const ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL);
      if (w <= 0) {
        *error = std::string("send: ") + std::strerror(errno);
        return false;
      }
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    return true;
  }
  // SO_LINGER 0: close sends RST instead of FIN.
  void reset() {
    linger l{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    ::close(fd_);
    fd_ = -1;
  }
  ~RawConnector() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  int fd_ = -1;
};

// A fault on the wire surfaces as ncclRemoteError (6) at whichever call meets it first: the irecv that is posted after
// the fault was read, or the test() of a receive posted before it. Both are what NCCL's proxy handles; which one
// happens depends on the timing of the two processes.
bool failedWithRemoteError(const std::string& out) {
  return out.find("EXPECTED-ERROR test(recv) 6") != std::string::npos ||
         out.find("EXPECTED-ERROR irecv 6") != std::string::npos;
}

std::unique_ptr<Process> listenerExpectingError(const TempDir& dir, const std::string& sizes) {
  return std::make_unique<Process>(
      std::vector<std::string>{kPeer, "--plugin", kPlugin, "--rank", "0", "--recv-from", "1", "--listen-out",
                               dir.path().string() + "/h0", "--sizes", sizes, "--expect-error", "--deadline-s", "60"},
      loopbackEnv(), dir.path().string() + "/listener");
}

TEST(NetFaults, ConnectionResetAfterTheHello) {
  TempDir dir;
  auto listener = listenerExpectingError(dir, "1M");
  RawConnector raw;
  std::string error;
  ASSERT_TRUE(raw.connectTo(dir.path().string() + "/h0", &error)) << error << listener->dump();
  ASSERT_TRUE(listener->waitForOutput("READY", 30s)) << "the hello was accepted\n" << listener->dump();
  raw.reset();
  EXPECT_EQ(listener->wait(45s), 0) << listener->dump();
  EXPECT_TRUE(failedWithRemoteError(listener->out())) << listener->dump();
  EXPECT_NE(listener->err().find("[plugin WARN] OptiFlow/Net:"), std::string::npos) << listener->dump();
}

TEST(NetFaults, GarbageAfterAValidHello) {
  TempDir dir;
  auto listener = listenerExpectingError(dir, "4097");
  RawConnector raw;
  std::string error;
  ASSERT_TRUE(raw.connectTo(dir.path().string() + "/h0", &error)) << error << listener->dump();
  ASSERT_TRUE(listener->waitForOutput("READY", 30s)) << listener->dump();
  std::vector<std::uint8_t> garbage(4096);
  std::uint64_t x = 0x243f6a8885a308d3ull;
  for (auto& b : garbage) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<std::uint8_t>(x >> 56);
  }
  ASSERT_TRUE(raw.sendAll(garbage.data(), garbage.size(), &error)) << error;
  EXPECT_EQ(listener->wait(45s), 0) << "a corrupt frame is an error, not a crash or a hang\n" << listener->dump();
  EXPECT_TRUE(failedWithRemoteError(listener->out())) << listener->dump();
  EXPECT_NE(listener->err().find("[plugin WARN] OptiFlow/Net:"), std::string::npos) << listener->dump();
}

// A frame header that claims more bytes than the posted receive holds: refused (NCCL's rule: smaller is an error).
TEST(NetFaults, MessageLargerThanThePostedReceive) {
  TempDir dir;
  const std::string h = dir.path().string() + "/h0";
  Process receiver({kPeer, "--plugin", kPlugin, "--rank", "0", "--recv-from", "1", "--listen-out", h, "--sizes", "4096",
                    "--expect-error", "--deadline-s", "60"},
                   loopbackEnv(), dir.path().string() + "/recv");
  // The receiver's buffers hold 4096 bytes; the sender's message is 1 MiB.
  Process sender({kPeer, "--plugin", kPlugin, "--rank", "1", "--connect-in", h, "--sizes", "1M", "--deadline-s", "60",
                  "--expect-error"},
                 loopbackEnv(), dir.path().string() + "/send");
  EXPECT_EQ(receiver.wait(75s), 0) << receiver.dump();  // both processes stop by their 60 s deadline
  EXPECT_NE(receiver.err().find("[plugin WARN] OptiFlow/Net:"), std::string::npos) << receiver.dump();
  const int senderCode = sender.wait(30s);
  EXPECT_TRUE(senderCode == 0 || senderCode == 4) << "the sender either sees the reset or finished first\n"
                                                  << sender.dump();
}

}  // namespace
