// RDMA memory registrations: a per-device cache of MRs (one PD per device, so an MR is valid on every comm:
// regIsGlobal), reused when a later registration lies inside an earlier one; DMA-BUF registrations; deregistration.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "ib_comm.h"

namespace optiflow::net::ib {
namespace {

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

}  // namespace

ibv_mr* RegCache::acquire(const VerbsApi& api, ibv_pd* pd, std::uintptr_t begin, std::uintptr_t end, int type) {
  std::lock_guard lock(mutex_);
  for (Entry& e : entries_) {
    if (e.type == type && e.begin <= begin && end <= e.end) {
      ++e.refs;
      return e.mr;
    }
  }
  ibv_mr* mr = api.regMr(pd, reinterpret_cast<void*>(begin), end - begin, kAccess);
  if (mr != nullptr) entries_.push_back({begin, end, type, mr, 1});
  return mr;
}

bool RegCache::release(const VerbsApi& api, ibv_mr* mr) {
  std::lock_guard lock(mutex_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->mr != mr) continue;
    if (--it->refs == 0) {
      api.deregMr(mr);
      entries_.erase(it);
    }
    return true;
  }
  return false;
}

void RegCache::clear(const VerbsApi& api) {
  std::lock_guard lock(mutex_);
  for (Entry& e : entries_) api.deregMr(e.mr);
  entries_.clear();
}

Result regMrOn(Device* device, void* data, std::size_t size, int type, MemHandle** mh) noexcept {
  if (mh == nullptr || data == nullptr) {
    device->warn(strf("regMr on %s: null %s", device->port.props.name.c_str(), mh == nullptr ? "mhandle" : "data"));
    return Result::kInvalidArgument;
  }
  if (type != kPtrHost && type != kPtrCuda) {
    device->warn(
        strf("regMr on %s: pointer type %d is neither host (1) nor CUDA (2)", device->port.props.name.c_str(), type));
    return Result::kInvalidArgument;
  }
  if (type == kPtrCuda && (device->port.props.ptrSupport & kPtrCuda) == 0) {
    device->warn(strf("regMr on %s: CUDA memory %p but GPUDirect RDMA is unavailable (nvidia-peermem not loaded)",
                      device->port.props.name.c_str(), data));
    return Result::kInvalidUsage;
  }
  const auto address = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t begin = address & ~(kPageBytes - 1);
  const std::uintptr_t end = (address + std::max<std::size_t>(size, 1) + kPageBytes - 1) & ~(kPageBytes - 1);
  errno = 0;
  ibv_mr* mr = device->cache.acquire(*device->api, device->pd, begin, end, type);
  if (mr == nullptr) {
    device->warn(strf("ibv_reg_mr on %s failed for %zu bytes at %p (%s memory): %s", device->port.props.name.c_str(),
                      size, data, type == kPtrCuda ? "CUDA" : "host", std::strerror(errno)));
    return Result::kSystemError;
  }
  auto* handle = new (std::nothrow) IbMemHandle;
  if (handle == nullptr) {
    device->cache.release(*device->api, mr);
    return Result::kSystemError;
  }
  handle->mr = mr;
  handle->type = type;
  handle->begin = begin;
  handle->end = end;
  *mh = handle;
  return Result::kOk;
}

Result regDmaBufOn(Device* device, void* data, std::size_t size, int type, std::uint64_t offset, int fd,
                   MemHandle** mh) noexcept {
  if (mh == nullptr) return Result::kInvalidArgument;
  if (device->api->regDmabufMr == nullptr || (device->port.props.ptrSupport & kPtrDmaBuf) == 0) {
    device->warn(strf("regMrDmaBuf on %s: DMA-BUF registration is not supported here (ibv_reg_dmabuf_mr %s)",
                      device->port.props.name.c_str(),
                      device->api->regDmabufMr == nullptr ? "missing in libibverbs" : "refused by the kernel"));
    return Result::kInvalidUsage;
  }
  errno = 0;
  const auto address = reinterpret_cast<std::uintptr_t>(data);
  ibv_mr* mr = device->api->regDmabufMr(device->pd, offset, size, address, fd, kAccess);
  if (mr == nullptr) {
    device->warn(strf("ibv_reg_dmabuf_mr on %s failed for %zu bytes at %p (fd %d, offset %llu): %s",
                      device->port.props.name.c_str(), size, data, fd, static_cast<unsigned long long>(offset),
                      std::strerror(errno)));
    return Result::kSystemError;
  }
  auto* handle = new (std::nothrow) IbMemHandle;
  if (handle == nullptr) {
    device->api->deregMr(mr);
    return Result::kSystemError;
  }
  handle->mr = mr;
  handle->type = type == kPtrHost ? kPtrHost : kPtrCuda;
  handle->cached = false;
  handle->begin = address;
  handle->end = address + size;
  *mh = handle;
  return Result::kOk;
}

Result deregOn(Device* device, MemHandle* mh) noexcept {
  auto* handle = dynamic_cast<IbMemHandle*>(mh);
  if (handle == nullptr) {
    device->warn(strf("deregMr on %s: %p is not a memory handle of this transport", device->port.props.name.c_str(),
                      static_cast<void*>(mh)));
    return Result::kInvalidArgument;
  }
  if (handle->cached) {
    device->cache.release(*device->api, handle->mr);
  } else {
    device->api->deregMr(handle->mr);
  }
  delete handle;
  return Result::kOk;
}

IbMemHandle* checkedHandle(Device* device, const char* what, const void* data, std::size_t size, MemHandle* mh) {
  auto* handle = dynamic_cast<IbMemHandle*>(mh);
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  if (handle == nullptr || begin < handle->begin || begin + size > handle->end || begin + size < begin) {
    device->warn(strf("%s on %s: buffer %p + %zu bytes is not inside its registration (%s)", what,
                      device->port.props.name.c_str(), data, size, handle == nullptr ? "no handle" : "out of range"));
    return nullptr;
  }
  return handle;
}

}  // namespace optiflow::net::ib
