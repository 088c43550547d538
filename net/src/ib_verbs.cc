// Loading libibverbs at run time and finding the ports the RDMA transport may use.
#include "ib_verbs.h"

#include <dlfcn.h>
#include <endian.h>

#include <sys/stat.h>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>

namespace optiflow::net::ib {
namespace {

// The exported ibv_query_port takes the smaller compat struct; it is only the fallback for providers without the
// extended op (what the header's inline wrapper does too).
using CompatQueryPort = int (*)(ibv_context*, std::uint8_t, ibv_port_attr*);
CompatQueryPort gCompatQueryPort = nullptr;

int realQueryPort(ibv_context* context, std::uint8_t port, ibv_port_attr* attr) {
  verbs_context* vctx = verbs_get_ctx(context);
  if (vctx != nullptr && vctx->sz >= sizeof(*vctx) - offsetof(verbs_context, query_port) &&
      vctx->query_port != nullptr) {
    return vctx->query_port(context, port, attr, sizeof(*attr));
  }
  std::memset(attr, 0, sizeof(*attr));
  return gCompatQueryPort(context, port, attr);
}
int realPostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) { return ibv_post_send(qp, wr, bad); }
int realPostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) { return ibv_post_recv(qp, wr, bad); }
int realPollCq(ibv_cq* cq, int entries, ibv_wc* wc) { return ibv_poll_cq(cq, entries, wc); }

template <typename Fn>
bool resolve(void* library, const char* path, const char* symbol, Fn* out, std::string* error) {
  void* address = dlsym(library, symbol);
  if (address == nullptr) {
    if (error != nullptr) *error = std::string(path) + " lacks " + symbol + " (rdma-core too old?)";
    return false;
  }
  *out = reinterpret_cast<Fn>(address);
  return true;
}

std::string errnoText(int e) {
  const char* name = e == ENOSYS   ? " (ENOSYS)"
                     : e == ENODEV ? " (ENODEV)"
                     : e == EPERM  ? " (EPERM)"
                     : e == EACCES ? " (EACCES)"
                                   : "";
  return std::string(std::strerror(e)) + name;
}

bool fail(std::string* error, std::string message) {
  if (error != nullptr) *error = std::move(message);
  return false;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string readLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

bool ipv4Mapped(const ibv_gid& gid) {
  for (int i = 0; i < 10; ++i) {
    if (gid.raw[i] != 0) return false;
  }
  return gid.raw[10] == 0xff && gid.raw[11] == 0xff;
}

// RoCE: the configured index, else the first RoCE v2 GID holding an IPv4 address, else the first RoCE v2 one, else 0.
bool pickGid(const VerbsApi& api, ibv_context* context, const std::string& devName, int port, int tableLength,
             const IbOptions& options, bool ethernet, const std::string& sysRoot, Port* out, std::string* reason) {
  const auto query = [&](int index, ibv_gid* gid) {
    return api.queryGid(context, static_cast<std::uint8_t>(port), index, gid) == 0;
  };
  if (options.gidIndex >= 0) {
    if (options.gidIndex >= tableLength) {
      *reason = devName + ":" + std::to_string(port) + " has " + std::to_string(tableLength) + " GIDs, GID index " +
                std::to_string(options.gidIndex) + " does not exist";
      return false;
    }
    out->gidIndex = options.gidIndex;
    if (!query(options.gidIndex, &out->gid)) {
      *reason = devName + ":" + std::to_string(port) + ": ibv_query_gid(" + std::to_string(options.gidIndex) +
                ") failed: " + errnoText(errno);
      return false;
    }
    return true;
  }
  out->gidIndex = 0;
  if (!ethernet) {
    if (!query(0, &out->gid)) std::memset(&out->gid, 0, sizeof(out->gid));  // IB routes by LID; the GID is unused
    return true;
  }
  const std::string typeDir =
      sysRoot + "/class/infiniband/" + devName + "/ports/" + std::to_string(port) + "/gid_attrs/types/";
  int firstV2 = -1;
  const int limit = tableLength < 256 ? tableLength : 256;
  for (int i = 0; i < limit; ++i) {
    if (readLine(typeDir + std::to_string(i)) != "RoCE v2") continue;
    ibv_gid gid{};
    if (!query(i, &gid)) continue;
    if (ipv4Mapped(gid)) {
      out->gidIndex = i;
      out->gid = gid;
      return true;
    }
    if (firstV2 < 0) firstV2 = i;
  }
  if (firstV2 >= 0) out->gidIndex = firstV2;
  if (!query(out->gidIndex, &out->gid)) {
    *reason = devName + ":" + std::to_string(port) + ": ibv_query_gid(" + std::to_string(out->gidIndex) +
              ") failed: " + errnoText(errno);
    return false;
  }
  return true;
}

struct Filter {
  std::string device;
  int port = 0;  // 0: every port
  bool matched = false;
};

}  // namespace

bool loadVerbs(const char* path, VerbsApi* api, std::string* error) {
  dlerror();
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    return fail(error, std::string("cannot load ") + path + ": " + (why != nullptr ? why : "unknown error") +
                           " (install rdma-core to use RDMA)");
  }
  VerbsApi table;
  CompatQueryPort compatQueryPort = nullptr;
  const bool ok = resolve(library, path, "ibv_get_device_list", &table.getDeviceList, error) &&
                  resolve(library, path, "ibv_free_device_list", &table.freeDeviceList, error) &&
                  resolve(library, path, "ibv_get_device_name", &table.getDeviceName, error) &&
                  resolve(library, path, "ibv_get_device_guid", &table.getDeviceGuid, error) &&
                  resolve(library, path, "ibv_open_device", &table.openDevice, error) &&
                  resolve(library, path, "ibv_close_device", &table.closeDevice, error) &&
                  resolve(library, path, "ibv_query_device", &table.queryDevice, error) &&
                  resolve(library, path, "ibv_query_port", &compatQueryPort, error) &&
                  resolve(library, path, "ibv_query_gid", &table.queryGid, error) &&
                  resolve(library, path, "ibv_alloc_pd", &table.allocPd, error) &&
                  resolve(library, path, "ibv_dealloc_pd", &table.deallocPd, error) &&
                  resolve(library, path, "ibv_reg_mr", &table.regMr, error) &&
                  resolve(library, path, "ibv_dereg_mr", &table.deregMr, error) &&
                  resolve(library, path, "ibv_create_cq", &table.createCq, error) &&
                  resolve(library, path, "ibv_destroy_cq", &table.destroyCq, error) &&
                  resolve(library, path, "ibv_create_qp", &table.createQp, error) &&
                  resolve(library, path, "ibv_modify_qp", &table.modifyQp, error) &&
                  resolve(library, path, "ibv_destroy_qp", &table.destroyQp, error) &&
                  resolve(library, path, "ibv_wc_status_str", &table.wcStatusStr, error);
  if (!ok) {
    dlclose(library);
    return false;
  }
  void* dmabuf = dlsym(library, "ibv_reg_dmabuf_mr");
  if (dmabuf != nullptr) table.regDmabufMr = reinterpret_cast<decltype(table.regDmabufMr)>(dmabuf);
  gCompatQueryPort = compatQueryPort;
  table.queryPort = realQueryPort;
  table.postSend = realPostSend;
  table.postRecv = realPostRecv;
  table.pollCq = realPollCq;
  *api = table;
  return true;
}

const VerbsApi* systemVerbs(std::string* error) {
  static std::once_flag once;
  static VerbsApi api;
  static bool loaded = false;
  static std::string loadError;
  std::call_once(once, [] { loaded = loadVerbs(kVerbsLibrary, &api, &loadError); });
  if (!loaded) {
    if (error != nullptr) *error = loadError;
    return nullptr;
  }
  return &api;
}

int portSpeedMbps(std::uint8_t activeSpeed, std::uint8_t activeWidth) {
  int lane = 0;
  switch (activeSpeed) {
    case 1:
      lane = 2500;
      break;  // SDR
    case 2:
      lane = 5000;
      break;  // DDR
    case 4:
      lane = 10000;
      break;  // QDR
    case 8:
      lane = 10000;
      break;  // FDR10
    case 16:
      lane = 14000;
      break;  // FDR
    case 32:
      lane = 25000;
      break;  // EDR
    case 64:
      lane = 50000;
      break;  // HDR
    case 128:
      lane = 100000;
      break;  // NDR
    default:
      return 0;
  }
  int lanes = 0;
  switch (activeWidth) {
    case 1:
      lanes = 1;
      break;
    case 2:
      lanes = 4;
      break;
    case 4:
      lanes = 8;
      break;
    case 8:
      lanes = 12;
      break;
    case 16:
      lanes = 2;
      break;
    default:
      return 0;
  }
  return lane * lanes;
}

bool discover(const VerbsApi& api, const IbOptions& options, const std::string& sysRoot, Discovery* out,
              std::string* error) {
  std::vector<Filter> filters;
  for (const std::string& entry : options.devices) {
    Filter f;
    const auto colon = entry.find(':');
    f.device = entry.substr(0, colon);
    if (colon != std::string::npos) {
      char* end = nullptr;
      const long port = std::strtol(entry.c_str() + colon + 1, &end, 10);
      if (end == entry.c_str() + colon + 1 || *end != '\0' || port < 1 || port > 255) {
        return fail(error, "RDMA device filter '" + entry + "': expected a device name or device:port");
      }
      f.port = static_cast<int>(port);
    }
    filters.push_back(f);
  }
  const auto wanted = [&](const std::string& device, int port) {
    if (filters.empty()) return true;
    bool any = false;
    for (const Filter& f : filters) {
      if (f.device == device && (port == 0 || f.port == 0 || f.port == port)) any = true;
    }
    return any;
  };

  errno = 0;
  int count = 0;
  ibv_device** list = api.getDeviceList(&count);
  if (list == nullptr) {
    const int e = errno;
    std::string message = "ibv_get_device_list: " + errnoText(e);
    if (e == ENOSYS) message += ": no RDMA kernel support (ib_uverbs not loaded)";
    return fail(error, message);
  }
  std::vector<std::string> reasons;
  for (int i = 0; i < count && list[i] != nullptr; ++i) {
    const char* rawName = api.getDeviceName(list[i]);
    const std::string name = rawName != nullptr ? rawName : "?";
    if (!wanted(name, 0)) continue;
    errno = 0;
    ibv_context* context = api.openDevice(list[i]);
    if (context == nullptr) {
      reasons.push_back(name + ": ibv_open_device failed: " + errnoText(errno));
      continue;
    }
    ibv_device_attr deviceAttr{};
    if (api.queryDevice(context, &deviceAttr) != 0) {
      reasons.push_back(name + ": ibv_query_device failed: " + errnoText(errno));
      api.closeDevice(context);
      continue;
    }
    const int deviceIndex = static_cast<int>(out->devices.size());
    std::size_t kept = 0;
    for (int p = 1; p <= deviceAttr.phys_port_cnt; ++p) {
      if (!wanted(name, p)) continue;
      const std::string portName = name + ":" + std::to_string(p);
      Port port;
      port.device = deviceIndex;
      port.port = p;
      if (api.queryPort(context, static_cast<std::uint8_t>(p), &port.attr) != 0) {
        reasons.push_back(portName + ": ibv_query_port failed: " + errnoText(errno));
        continue;
      }
      if (port.attr.state != IBV_PORT_ACTIVE) {
        reasons.push_back(portName + " is not ACTIVE (state " + std::to_string(port.attr.state) + ")");
        continue;
      }
      const bool ethernet = port.attr.link_layer == IBV_LINK_LAYER_ETHERNET;
      if (!ethernet && port.attr.link_layer != IBV_LINK_LAYER_INFINIBAND &&
          port.attr.link_layer != IBV_LINK_LAYER_UNSPECIFIED) {
        reasons.push_back(portName + ": unknown link layer " + std::to_string(port.attr.link_layer));
        continue;
      }
      std::string reason;
      if (!pickGid(api, context, name, p, port.attr.gid_tbl_len, options, ethernet, sysRoot, &port, &reason)) {
        reasons.push_back(reason);
        continue;
      }
      DeviceProps& props = port.props;
      props.name = portName;
      char resolved[PATH_MAX];
      const std::string devicePath = sysRoot + "/class/infiniband/" + name + "/device";
      if (::realpath(devicePath.c_str(), resolved) != nullptr) props.pciPath = resolved;
      props.guid = be64toh(api.getDeviceGuid(list[i]));
      props.ptrSupport = kPtrHost;
      if (exists(sysRoot + "/kernel/mm/memory_peers/nv_mem/version") || exists(sysRoot + "/module/nvidia_peermem") ||
          exists(sysRoot + "/module/nv_peer_mem")) {
        props.ptrSupport |= kPtrCuda;
      }
      props.regIsGlobal = true;
      props.speedMbps = portSpeedMbps(port.attr.active_speed, port.attr.active_width);
      if (props.speedMbps == 0) props.speedMbps = 10000;
      props.port = p;
      props.maxRecvs = kMaxRecvs;
      out->ports.push_back(std::move(port));
      ++kept;
      for (Filter& f : filters) {
        if (f.device == name && (f.port == 0 || f.port == p)) f.matched = true;
      }
    }
    if (kept == 0) {
      api.closeDevice(context);
    } else {
      out->devices.push_back({name, context});
    }
  }
  api.freeDeviceList(list);

  for (const Filter& f : filters) {
    if (!f.matched) {
      closeDiscovery(api, out);
      return fail(error, "RDMA device '" + f.device + (f.port != 0 ? ":" + std::to_string(f.port) : "") +
                             "' not found or has no usable port" +
                             (reasons.empty() ? std::string() : " (" + reasons.front() + ")"));
    }
  }
  if (out->ports.empty()) {
    std::string message = count == 0 ? "no RDMA device (ibv_get_device_list returned none)" : "no active RDMA port";
    for (std::size_t i = 0; i < reasons.size() && i < 4; ++i) message += (i == 0 ? ": " : "; ") + reasons[i];
    closeDiscovery(api, out);
    return fail(error, message);
  }
  return true;
}

void closeDiscovery(const VerbsApi& api, Discovery* discovery) {
  for (OpenDevice& d : discovery->devices) {
    if (d.context != nullptr) api.closeDevice(d.context);
    d.context = nullptr;
  }
  discovery->devices.clear();
  discovery->ports.clear();
}

}  // namespace optiflow::net::ib
