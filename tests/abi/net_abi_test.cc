// The net plugin as NCCL sees it: libnccl-net-optiflow.so dlopen'ed RTLD_NOW|RTLD_LOCAL by path and by bare name,
// ncclNetPlugin_v9 ... _v12 driven in one process as NCCL's proxy does (non-blocking connect/accept alternated,
// regMr, isend/irecv/test), properties checked per version against our declarations, and the failure paths (bad
// handles, bad settings, misuse) checked for an error code plus a log line, never a crash or a hang. Each test that
// depends on init state works on a private copy of the library (LibraryCopy: its own statics).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "abi_test_support.h"
#include "nccl_net_host.h"
#include "optiflow/net/wire.h"
#include "optiflow/plugin/abi/nccl_net.h"
#include "optiflow/plugin/params.h"

namespace {

using namespace optiflow::abitest;
using Clock = std::chrono::steady_clock;

const std::string kNetLib = OPTIFLOW_NET_PLUGIN;
constexpr std::string_view kNetLogPrefix = "OptiFlow/Net:";

std::vector<std::string> netLines(std::optional<ncclDebugLogLevel> level = std::nullopt) {
  std::vector<std::string> out;
  for (const LogLine& l : capturedLog()) {
    if (l.text.rfind(kNetLogPrefix, 0) != 0) continue;
    if (level && l.level != *level) continue;
    out.push_back(l.text);
  }
  return out;
}

bool anyLineHas(const std::vector<std::string>& lines, std::string_view needle) {
  for (const std::string& l : lines) {
    if (l.find(needle) != std::string::npos) return true;
  }
  return false;
}

// NCCL's per-version shims in one place (tests/support/nccl_net_host.h), logging into the captured log.
struct NetApi : optiflow::testsupport::NcclNetHost {
  NetApi(void* lib, int abi) : NcclNetHost(captureLogger, 7) { load(lib, abi); }
};

// A private copy of the library with loopback-only settings in a clean environment. Never dlclose'd, like NCCL keeps
// its net plugin: the plugin's process state is deliberately never freed (proxy threads may call in while static
// destructors run), and unloading the copy would turn that state into a leak report under LSan.
class NetLibrary {
 public:
  explicit NetLibrary(std::map<std::string, std::string> env = {{"OPTIFLOW_NET_IFNAMES", "lo"}}) : copy_(kNetLib) {
    ::setenv("OPTIFLOW_NET_TRANSPORT", "tcp", 1);
    ::setenv("OPTIFLOW_NAMESPACE", ("netabi-" + std::to_string(getpid())).c_str(), 1);  // no segment: local telemetry
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    lib_ = dlopen(copy_.path().c_str(), kNcclDlopenFlags);
    capturedLog().clear();
  }
  void* get() const { return lib_; }
  explicit operator bool() const { return lib_ != nullptr; }

 private:
  CleanEnvironment cleanEnv_;
  LibraryCopy copy_;
  void* lib_ = nullptr;
};

struct Conn {
  void* lc = nullptr;
  void* sc = nullptr;
  void* rc = nullptr;
};

// NCCL's connection setup: listen, then alternate connect and accept until both comms exist (both non-blocking).
::testing::AssertionResult establish(NetApi& net, Conn* c, int dev = 0) {
  std::uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
  std::memset(handle, 0xee, sizeof(handle));
  if (ncclResult_t r = net.listen(dev, handle, &c->lc); r != ncclSuccess || c->lc == nullptr) {
    return ::testing::AssertionFailure() << "listen: " << r << "\n" << logDump();
  }
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (c->sc == nullptr || c->rc == nullptr) {
    if (c->sc == nullptr) {
      if (ncclResult_t r = net.connect(dev, handle, &c->sc); r != ncclSuccess) {
        return ::testing::AssertionFailure() << "connect: " << r << "\n" << logDump();
      }
    }
    if (c->rc == nullptr) {
      if (ncclResult_t r = net.accept(c->lc, &c->rc); r != ncclSuccess) {
        return ::testing::AssertionFailure() << "accept: " << r << "\n" << logDump();
      }
    }
    if (Clock::now() > deadline) return ::testing::AssertionFailure() << "connect/accept did not finish in 10 s";
  }
  return ::testing::AssertionSuccess();
}

void closeAll(NetApi& net, Conn& c) {
  if (c.sc != nullptr) {
    EXPECT_EQ(net.closeSend(c.sc), ncclSuccess);
  }
  if (c.rc != nullptr) {
    EXPECT_EQ(net.closeRecv(c.rc), ncclSuccess);
  }
  if (c.lc != nullptr) {
    EXPECT_EQ(net.closeListen(c.lc), ncclSuccess);
  }
  c = Conn{};
}

std::uint8_t patternByte(std::size_t i, int msg) {
  return static_cast<std::uint8_t>((i * 131 + (i >> 9) + msg * 17) & 0xff);
}

struct Pending {
  void* req;
  int* sizes;  // may be null
};

// Polls every request until all are done: on loopback both sides need progress, in whatever order.
::testing::AssertionResult waitAll(NetApi& net, std::vector<Pending> reqs) {
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (!reqs.empty()) {
    for (std::size_t i = 0; i < reqs.size();) {
      int done = 0;
      if (ncclResult_t r = net.test(reqs[i].req, &done, reqs[i].sizes); r != ncclSuccess) {
        return ::testing::AssertionFailure() << "test: " << r << "\n" << logDump();
      }
      if (done != 0) {
        reqs.erase(reqs.begin() + static_cast<long>(i));
      } else {
        ++i;
      }
    }
    if (Clock::now() > deadline) return ::testing::AssertionFailure() << reqs.size() << " requests not done in 20 s";
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------------------------
// Loading and the tables

TEST(NetTables, LoadedByPathAndByBareNameWithEveryVersion) {
  Library byPath = Library::open(kNetLib);
  ASSERT_TRUE(byPath) << dlerrorText();
  // NCCL_NET_PLUGIN=optiflow: NCCL tries "optiflow", then libnccl-net-optiflow.so through LD_LIBRARY_PATH.
  OpenResult bare = ncclStyleOpen("optiflow", "net");
  Library byName(bare.handle);
  ASSERT_TRUE(byName) << ::testing::PrintToString(bare.tried) << ": " << dlerrorText();
  EXPECT_EQ(bare.tried.back(), "libnccl-net-optiflow.so");
  EXPECT_EQ(loadedPath(byName.get()), canonicalPath(kNetLib));
  Library soname(dlopen("libnccl-net-optiflow.so", kNcclDlopenFlags));
  ASSERT_TRUE(soname) << dlerrorText();

  for (int abi = 9; abi <= 12; ++abi) {
    NetApi net(byName.get(), abi);
    ASSERT_TRUE(net.ok()) << "ncclNetPlugin_v" << abi;
  }
  const auto* v9 = byPath.table<ncclNet_v9_t>("ncclNetPlugin_v9");
  const auto* v10 = byPath.table<ncclNet_v10_t>("ncclNetPlugin_v10");
  const auto* v11 = byPath.table<ncclNet_v11_t>("ncclNetPlugin_v11");
  const auto* v12 = byPath.table<ncclNet_v12_t>("ncclNetPlugin_v12");
  ASSERT_TRUE(v9 && v10 && v11 && v12);
  for (const char* name : {v9->name, v10->name, v11->name, v12->name}) EXPECT_STREQ(name, "OptiFlow");
  // Every entry is filled except makeVDevice (NULL: no NIC fusion), v9 through v12.
  auto entries = [](const void* table, std::size_t size) {
    std::vector<const void*> v(size / sizeof(void*));
    std::memcpy(v.data(), table, size);
    return v;
  };
  const std::size_t makeVDeviceIndex = offsetof(ncclNet_v9_t, makeVDevice) / sizeof(void*);
  for (const auto& [table, size] : std::vector<std::pair<const void*, std::size_t>>{
           {v9, sizeof(*v9)}, {v10, sizeof(*v10)}, {v11, sizeof(*v11)}, {v12, sizeof(*v12)}}) {
    const std::vector<const void*> e = entries(table, size);
    for (std::size_t i = 0; i < e.size(); ++i) {
      if (i == makeVDeviceIndex) {
        EXPECT_EQ(e[i], nullptr) << "makeVDevice";
      } else {
        EXPECT_NE(e[i], nullptr) << "entry " << i << " of a " << size << "-byte table";
      }
    }
  }
  // NCCL probes newest first; nothing newer than v12 and no CollNet.
  EXPECT_EQ(dlsym(byPath.get(), "ncclNetPlugin_v13"), nullptr);
  EXPECT_EQ(dlsym(byPath.get(), "ncclNetPlugin_v8"), nullptr);
  for (int v = 6; v <= 12; ++v) {
    EXPECT_EQ(dlsym(byPath.get(), ("ncclCollNetPlugin_v" + std::to_string(v)).c_str()), nullptr) << v;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Init, devices, properties

class PerVersion : public ::testing::TestWithParam<int> {};

template <typename Props>
struct Guarded {
  Props props;
  std::uint8_t guard[64];
};

template <typename Props>
void checkCommonProperties(const Props& p, int dev) {
  ASSERT_NE(p.name, nullptr);
  EXPECT_STREQ(p.name, "lo");
  EXPECT_EQ(p.pciPath, nullptr) << "lo is virtual";
  EXPECT_NE(p.ptrSupport & NCCL_PTR_HOST, 0);
  EXPECT_EQ(p.ptrSupport & NCCL_PTR_CUDA, 0) << "the TCP transport never reads GPU memory";
  EXPECT_GT(p.speed, 0);
  EXPECT_GT(p.maxComms, 0);
  EXPECT_GE(p.maxRecvs, 1);
  EXPECT_LE(p.maxRecvs, 8);
  EXPECT_EQ(p.netDeviceType, NCCL_NET_DEVICE_HOST);
  EXPECT_EQ(p.netDeviceVersion, 0);
  EXPECT_EQ(p.vProps.ndevs, 1);
  EXPECT_EQ(p.vProps.devs[0], dev);
  EXPECT_EQ(p.maxP2pBytes, std::size_t{1} << 30);
  EXPECT_GT(p.maxCollBytes, 0u);
  EXPECT_LE(p.maxCollBytes, std::size_t{1} << 40);
}

template <typename Props, typename GetProperties>
void checkProperties(GetProperties getProperties, int dev) {
  Guarded<Props> g;
  std::memset(&g, 0xcd, sizeof(g));
  ASSERT_EQ(getProperties(dev, &g.props), ncclSuccess) << logDump();
  for (std::uint8_t b : g.guard) ASSERT_EQ(b, 0xcd) << "getProperties wrote past sizeof(props) = " << sizeof(Props);
  checkCommonProperties(g.props, dev);
  if constexpr (requires { g.props.maxMultiRequestSize; }) {
    EXPECT_EQ(g.props.maxMultiRequestSize, 1);
  }
  if constexpr (requires { g.props.railId; }) {
    EXPECT_EQ(g.props.railId, NCCL_NET_ID_UNDEF);
    EXPECT_EQ(g.props.planeId, NCCL_NET_ID_UNDEF);
  }
}

TEST_P(PerVersion, InitDevicesAndProperties) {
  NetLibrary lib;
  ASSERT_TRUE(lib) << dlerrorText();
  NetApi net(lib.get(), GetParam());
  ASSERT_TRUE(net.ok());
  ASSERT_EQ(net.init(), ncclSuccess) << logDump();
  int ndev = 0;
  ASSERT_EQ(net.devices(&ndev), ncclSuccess);
  ASSERT_EQ(ndev, 1) << "OPTIFLOW_NET_IFNAMES=lo";
  EXPECT_TRUE(anyLineHas(netLines(NCCL_LOG_INFO), "device")) << logDump();
  switch (GetParam()) {
    case 9:
      checkProperties<ncclNetProperties_v9_t>(net.v9()->getProperties, 0);
      break;
    case 10:
      checkProperties<ncclNetProperties_v10_t>(net.v10()->getProperties, 0);
      break;
    case 11:
      checkProperties<ncclNetProperties_v11_t>(net.v11()->getProperties, 0);
      break;
    default:
      checkProperties<ncclNetProperties_v12_t>(net.v12()->getProperties, 0);
      break;
  }
  // A device that does not exist: an error and a line naming it.
  capturedLog().clear();
  ncclNetProperties_v12_t big{};
  ncclResult_t r = GetParam() == 9    ? net.v9()->getProperties(5, reinterpret_cast<ncclNetProperties_v9_t*>(&big))
                   : GetParam() == 10 ? net.v10()->getProperties(5, reinterpret_cast<ncclNetProperties_v10_t*>(&big))
                   : GetParam() == 11 ? net.v11()->getProperties(5, reinterpret_cast<ncclNetProperties_v11_t*>(&big))
                                      : net.v12()->getProperties(5, &big);
  EXPECT_EQ(r, ncclInvalidArgument);
  EXPECT_TRUE(anyLineHas(netLines(NCCL_LOG_WARN), "device 5")) << logDump();
  EXPECT_EQ(net.finalize(), ncclSuccess);
}

// ---------------------------------------------------------------------------------------------------------------
// Data in one process

TEST_P(PerVersion, LoopbackSendRecvOfSeveralSizes) {
  NetLibrary lib;
  ASSERT_TRUE(lib) << dlerrorText();
  NetApi net(lib.get(), GetParam());
  ASSERT_EQ(net.init(), ncclSuccess) << logDump();
  Conn c;
  ASSERT_TRUE(establish(net, &c));

  const std::vector<std::size_t> sizes = {0, 1, 4097, 1 << 20, (8 << 20) + 3};
  std::vector<std::uint8_t> sbuf((8 << 20) + 3), rbuf((8 << 20) + 64);
  void* smh = nullptr;
  void* rmh = nullptr;
  ASSERT_EQ(net.regMr(c.sc, sbuf.data(), sbuf.size(), &smh), ncclSuccess) << logDump();
  ASSERT_EQ(net.regMr(c.rc, rbuf.data(), rbuf.size(), &rmh), ncclSuccess) << logDump();
  for (std::size_t m = 0; m < sizes.size(); ++m) {
    const std::size_t n = sizes[m];
    for (std::size_t i = 0; i < n; ++i) sbuf[i] = patternByte(i, static_cast<int>(m));
    std::memset(rbuf.data(), 0x5a, rbuf.size());
    void* rreq = nullptr;
    void* sreq = nullptr;
    void* data[1] = {rbuf.data()};
    size_t rsizes[1] = {rbuf.size()};  // a receive may be larger than the send
    int tags[1] = {3};
    void* mhs[1] = {rmh};
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (rreq == nullptr) {
      ASSERT_EQ(net.irecv(c.rc, 1, data, rsizes, tags, mhs, &rreq), ncclSuccess) << logDump();
      ASSERT_LT(Clock::now(), deadline);
    }
    while (sreq == nullptr) {
      ASSERT_EQ(net.isend(c.sc, sbuf.data(), n, 3, smh, &sreq), ncclSuccess) << logDump();
      ASSERT_LT(Clock::now(), deadline);
    }
    int got[1] = {-1};
    int sent = -1;
    ASSERT_TRUE(waitAll(net, {{sreq, &sent}, {rreq, got}})) << n << " bytes";
    EXPECT_EQ(sent, static_cast<int>(n));
    ASSERT_EQ(got[0], static_cast<int>(n));
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(rbuf[i], patternByte(i, static_cast<int>(m))) << "byte " << i;
    EXPECT_EQ(rbuf[n], 0x5a) << "wrote past the message";
    // A completed request is dead: testing it again is refused, not a crash.
    int done = 0;
    capturedLog().clear();
    EXPECT_NE(net.test(rreq, &done, nullptr), ncclSuccess);
    EXPECT_TRUE(anyLineHas(netLines(NCCL_LOG_WARN), "not a live request")) << logDump();
  }
  // Grouped receive: two buffers, tags route two sends sent in the opposite order.
  capturedLog().clear();
  {
    std::vector<std::uint8_t> a(100), b(200);
    void* rreq = nullptr;
    void* data[2] = {rbuf.data(), rbuf.data() + 4096};
    size_t rsizes[2] = {4096, 4096};
    int tags[2] = {11, 12};
    void* mhs[2] = {rmh, rmh};
    ASSERT_EQ(net.irecv(c.rc, 2, data, rsizes, tags, mhs, &rreq), ncclSuccess);
    ASSERT_NE(rreq, nullptr);
    for (std::size_t i = 0; i < 300; ++i) sbuf[i] = patternByte(i, 99);
    void* s12 = nullptr;
    void* s11 = nullptr;
    ASSERT_EQ(net.isend(c.sc, sbuf.data() + 100, 200, 12, smh, &s12), ncclSuccess);
    ASSERT_EQ(net.isend(c.sc, sbuf.data(), 100, 11, smh, &s11), ncclSuccess);
    ASSERT_TRUE(s12 != nullptr && s11 != nullptr);
    int got[2] = {-1, -1};
    ASSERT_TRUE(waitAll(net, {{s12, nullptr}, {rreq, got}, {s11, nullptr}}));
    EXPECT_EQ(got[0], 100);
    EXPECT_EQ(got[1], 200);
    EXPECT_EQ(std::memcmp(rbuf.data(), sbuf.data(), 100), 0);
    EXPECT_EQ(std::memcmp(rbuf.data() + 4096, sbuf.data() + 100, 200), 0);
  }
  EXPECT_EQ(net.deregMr(c.sc, smh), ncclSuccess);
  EXPECT_EQ(net.deregMr(c.rc, rmh), ncclSuccess);
  closeAll(net, c);
  EXPECT_EQ(net.finalize(), ncclSuccess);
  EXPECT_TRUE(netLines(NCCL_LOG_WARN).empty()) << logDump();
}

INSTANTIATE_TEST_SUITE_P(Abi, PerVersion, ::testing::Values(9, 10, 11, 12),
                         [](const ::testing::TestParamInfo<int>& p) { return "v" + std::to_string(p.param); });

// ---------------------------------------------------------------------------------------------------------------
// Failure paths: an error code and a log line, never a crash or a hang

// Connect with a handle NCCL would never have produced; returns the first error (or success if the connect kept
// reporting "in progress" for 5 s, which is a failure for the caller).
ncclResult_t connectUntilError(NetApi& net, std::uint8_t* handle) {
  void* sc = nullptr;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < deadline) {
    const ncclResult_t r = net.connect(0, handle, &sc);
    if (r != ncclSuccess) return r;
    if (sc != nullptr) {
      net.closeSend(sc);
      return ncclSuccess;
    }
  }
  return ncclSuccess;
}

TEST(NetFailures, BadHandlesAreRefusedWithALogLine) {
  NetLibrary lib;
  NetApi net(lib.get(), 12);
  ASSERT_EQ(net.init(), ncclSuccess) << logDump();

  std::mt19937_64 rng(12345);
  for (int trial = 0; trial < 20; ++trial) {  // random bytes, including values that look like pointers
    std::uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
    for (auto& b : handle) b = static_cast<std::uint8_t>(rng());
    if (trial % 2 == 1) {
      void* p = &handle;  // a pointer to ourselves in the payload: must never be followed
      std::memcpy(handle + 16, &p, sizeof(p));
    }
    capturedLog().clear();
    EXPECT_NE(connectUntilError(net, handle), ncclSuccess) << "trial " << trial;
    EXPECT_FALSE(netLines(NCCL_LOG_WARN).empty()) << logDump();
  }

  // A real handle from another build: refused, and the line says so.
  Conn c;
  std::uint8_t real[NCCL_NET_HANDLE_MAXSIZE];
  ASSERT_EQ(net.listen(0, real, &c.lc), ncclSuccess);
  optiflow::net::wire::TcpHandle decoded;
  std::string error;
  ASSERT_TRUE(optiflow::net::wire::decodeTcpHandle(real, &decoded, &error)) << error;
  decoded.buildId ^= 0x1;
  std::uint8_t foreign[NCCL_NET_HANDLE_MAXSIZE];
  ASSERT_TRUE(optiflow::net::wire::encodeTcpHandle(decoded, foreign));
  capturedLog().clear();
  EXPECT_NE(connectUntilError(net, foreign), ncclSuccess);
  EXPECT_TRUE(anyLineHas(netLines(NCCL_LOG_WARN), "build")) << logDump();

  // Truncated: only the first 24 bytes arrived.
  std::uint8_t truncated[NCCL_NET_HANDLE_MAXSIZE] = {};
  std::memcpy(truncated, real, 24);
  capturedLog().clear();
  EXPECT_NE(connectUntilError(net, truncated), ncclSuccess);
  EXPECT_FALSE(netLines(NCCL_LOG_WARN).empty()) << logDump();

  // After all that, the real handle still connects (the registry kept no stale state for that buffer address).
  void* sc = nullptr;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (sc == nullptr || c.rc == nullptr) {
    if (sc == nullptr) {
      ASSERT_EQ(net.connect(0, real, &sc), ncclSuccess) << logDump();
    }
    if (c.rc == nullptr) {
      ASSERT_EQ(net.accept(c.lc, &c.rc), ncclSuccess) << logDump();
    }
    ASSERT_LT(Clock::now(), deadline);
  }
  c.sc = sc;
  closeAll(net, c);
  EXPECT_EQ(net.finalize(), ncclSuccess);
}

TEST(NetFailures, ABadSettingFailsInitNamingTheVariable) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"OPTIFLOW_NET_STREAMS", "0"},  {"OPTIFLOW_NET_STREAMS", "17"},          {"OPTIFLOW_NET_TRANSPORT", "rdma"},
      {"OPTIFLOW_NET_STRIPE", "yes"}, {"OPTIFLOW_NET_MIN_STRIPE_BYTES", "1x"}, {"OPTIFLOW_NET_IFNAMES", "lo,,eth0"}};
  for (const auto& [name, value] : bad) {
    for (int abi : {9, 12}) {
      std::map<std::string, std::string> env = {{"OPTIFLOW_NET_IFNAMES", "lo"}};
      env[name] = value;
      NetLibrary lib(env);
      NetApi net(lib.get(), abi);
      EXPECT_NE(net.init(), ncclSuccess) << name << "=" << value;
      EXPECT_TRUE(anyLineHas(netLines(NCCL_LOG_WARN), name + "='" + value + "'")) << logDump();
      int ndev = -1;
      EXPECT_NE(net.devices(&ndev), ncclSuccess) << "devices after a failed init";
      EXPECT_EQ(ndev, 0);
    }
  }
  // An interface that does not exist: init fails (no device), naming it.
  NetLibrary lib(std::map<std::string, std::string>{{"OPTIFLOW_NET_IFNAMES", "nosuchif0"}});
  NetApi net(lib.get(), 12);
  EXPECT_NE(net.init(), ncclSuccess);
  EXPECT_TRUE(anyLineHas(netLines(NCCL_LOG_WARN), "nosuchif0")) << logDump();
}

TEST(NetFailures, MisuseIsRefusedNotBelieved) {
  NetLibrary lib;
  NetApi net(lib.get(), 11);
  // Before init: no devices, no listen.
  int ndev = -1;
  EXPECT_NE(net.devices(&ndev), ncclSuccess);
  std::uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  EXPECT_NE(net.v11()->listen(nullptr, 0, handle, &lc), ncclSuccess);
  EXPECT_EQ(lc, nullptr);

  ASSERT_EQ(net.init(), ncclSuccess) << logDump();
  EXPECT_EQ(net.listen(3, handle, &lc), ncclInvalidArgument) << "device 3 does not exist";
  Conn c;
  ASSERT_TRUE(establish(net, &c));
  std::vector<std::uint8_t> buf(64);
  void* mh = nullptr;
  ASSERT_EQ(net.regMr(c.rc, buf.data(), buf.size(), &mh), ncclSuccess);
  capturedLog().clear();
  void* req = nullptr;
  EXPECT_EQ(net.isend(c.rc, buf.data(), 8, 0, mh, &req), ncclInvalidArgument) << "isend on a recv comm";
  EXPECT_EQ(req, nullptr);
  EXPECT_TRUE(anyLineHas(netLines(NCCL_LOG_WARN), "recv comm")) << logDump();
  void* data[9] = {};
  size_t sizes[9] = {};
  int tags[9] = {};
  void* mhs[9] = {};
  EXPECT_EQ(net.irecv(c.rc, 9, data, sizes, tags, mhs, &req), ncclInvalidArgument) << "n above maxRecvs";
  int done = 0;
  EXPECT_NE(net.test(nullptr, &done, nullptr), ncclSuccess);
  EXPECT_NE(net.closeSend(c.rc), ncclSuccess) << "closeSend of a recv comm";
  EXPECT_NE(net.v11()->finalize(c.lc), ncclSuccess) << "finalize of a listen comm";
  EXPECT_EQ(net.deregMr(c.rc, mh), ncclSuccess);
  closeAll(net, c);
  EXPECT_EQ(net.finalize(), ncclSuccess);
}

// v11+: init and finalize per communicator. The transport stays while any context lives and is rebuilt after the
// last one goes.
TEST(NetLifetime, ContextsAreCountedFromV11) {
  NetLibrary lib;
  NetApi a(lib.get(), 12), b(lib.get(), 12);
  ASSERT_EQ(a.init(), ncclSuccess) << logDump();
  ASSERT_EQ(b.init(), ncclSuccess);
  ASSERT_NE(a.ctx(), nullptr);
  ASSERT_NE(a.ctx(), b.ctx());
  EXPECT_EQ(a.finalize(), ncclSuccess);
  int ndev = 0;
  EXPECT_EQ(b.devices(&ndev), ncclSuccess) << "b's context still holds the transport";
  Conn c;
  ASSERT_TRUE(establish(b, &c));
  EXPECT_EQ(b.finalize(), ncclSuccess);
  // Comms outlive their context's finalize: still usable, then closed.
  std::vector<std::uint8_t> buf(16, 7);
  void* mh = nullptr;
  EXPECT_EQ(b.regMr(c.sc, buf.data(), buf.size(), &mh), ncclSuccess);
  EXPECT_EQ(b.deregMr(c.sc, mh), ncclSuccess);
  closeAll(b, c);
  EXPECT_TRUE(anyLineHas(netLines(NCCL_LOG_INFO), "transport closed")) << logDump();
  EXPECT_NE(b.devices(&ndev), ncclSuccess) << "no context, no comm: the transport is gone";
  NetApi again(lib.get(), 12);
  ASSERT_EQ(again.init(), ncclSuccess);
  EXPECT_EQ(again.devices(&ndev), ncclSuccess);
  EXPECT_EQ(ndev, 1);
  EXPECT_EQ(again.finalize(), ncclSuccess);
  // setNetAttr is accepted (hints only).
  ASSERT_EQ(again.init(), ncclSuccess);
  ncclNetAttr_v12_t attr;
  std::memset(&attr, 0xff, sizeof(attr));
  EXPECT_EQ(again.v12()->setNetAttr(again.ctx(), &attr), ncclSuccess);
  EXPECT_EQ(again.finalize(), ncclSuccess);
}

// ---------------------------------------------------------------------------------------------------------------
// The OPTIFLOW_NET_* registry entries (strict parsing)

const char* fakeValue = nullptr;
const char* fakeName = nullptr;
const char* fakeGetEnv(const char* name) { return std::strcmp(name, fakeName) == 0 ? fakeValue : nullptr; }

TEST(NetParams, StrictParsing) {
  using optiflow::plugin::Params;
  auto parse = [](const char* name, const char* value, Params* p, std::string* error) {
    fakeName = name;
    fakeValue = value;
    return optiflow::plugin::readParams(fakeGetEnv, p, error);
  };
  Params p;
  std::string error;
  ASSERT_TRUE(parse("OPTIFLOW_NET_STREAMS", "16", &p, &error)) << error;
  EXPECT_EQ(p.netStreams, 16);
  ASSERT_TRUE(parse("OPTIFLOW_NET_IFNAMES", "eth0,ib0.8001,veth-a_1", &p, &error)) << error;
  EXPECT_EQ(p.netIfnames, (std::vector<std::string>{"eth0", "ib0.8001", "veth-a_1"}));
  ASSERT_TRUE(parse("OPTIFLOW_NET_MIN_STRIPE_BYTES", "64K", &p, &error)) << error;
  EXPECT_EQ(p.netMinStripeBytes, 65536u);
  ASSERT_TRUE(parse("OPTIFLOW_NET_MIN_STRIPE_BYTES", "0", &p, &error)) << error;
  EXPECT_EQ(p.netMinStripeBytes, 0u);
  ASSERT_TRUE(parse("OPTIFLOW_NET_MIN_STRIPE_BYTES", "1G", &p, &error)) << error;
  EXPECT_EQ(p.netMinStripeBytes, 1u << 30);
  ASSERT_TRUE(parse("OPTIFLOW_NET_STRIPE", "1", &p, &error)) << error;
  EXPECT_TRUE(p.netStripe);
  ASSERT_TRUE(parse("OPTIFLOW_NET_TRANSPORT", "ib", &p, &error)) << error;
  EXPECT_EQ(p.netTransport, "ib");
  ASSERT_TRUE(parse("OPTIFLOW_NET_TRANSPORT", "", &p, &error)) << "empty means the default";
  EXPECT_EQ(p.netTransport, "auto");
  EXPECT_EQ(p.netStreams, 1);
  EXPECT_EQ(p.netMinStripeBytes, 262144u);

  for (const auto& [name, value] :
       std::vector<std::pair<const char*, const char*>>{{"OPTIFLOW_NET_STREAMS", "-1"},
                                                        {"OPTIFLOW_NET_STREAMS", " 2"},
                                                        {"OPTIFLOW_NET_STREAMS", "0x2"},
                                                        {"OPTIFLOW_NET_STREAMS", "99999999999999999999"},
                                                        {"OPTIFLOW_NET_IFNAMES", ","},
                                                        {"OPTIFLOW_NET_IFNAMES", "eth0 "},
                                                        {"OPTIFLOW_NET_IFNAMES", "a23456789012345x"},
                                                        {"OPTIFLOW_NET_IFNAMES", "../eth0"},
                                                        {"OPTIFLOW_NET_IFNAMES", "veth@if3"},
                                                        {"OPTIFLOW_NET_MIN_STRIPE_BYTES", "2G"},
                                                        {"OPTIFLOW_NET_MIN_STRIPE_BYTES", "K"},
                                                        {"OPTIFLOW_NET_MIN_STRIPE_BYTES", "-4"},
                                                        {"OPTIFLOW_NET_MIN_STRIPE_BYTES", "4KB"},
                                                        {"OPTIFLOW_NET_TRANSPORT", "TCP"}}) {
    error.clear();
    EXPECT_FALSE(parse(name, value, &p, &error)) << name << "=" << value;
    EXPECT_NE(error.find(std::string(name) + "='" + value + "'"), std::string::npos) << error;
  }
  const std::string table = optiflow::plugin::describeParams();
  for (const char* name : {"OPTIFLOW_NET_TRANSPORT", "OPTIFLOW_NET_IFNAMES", "OPTIFLOW_NET_STREAMS",
                           "OPTIFLOW_NET_STRIPE", "OPTIFLOW_NET_MIN_STRIPE_BYTES"}) {
    EXPECT_NE(table.find(std::string("`") + name + "`"), std::string::npos) << name;
  }
}

}  // namespace
