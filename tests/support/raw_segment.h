// A namespace's segment file mapped by the test itself, read-write: to look at records where the layout says they
// are, and to damage the segment the way a bug, another program or a writer that died mid-update could.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "optiflow/schedcache/layout.h"

namespace optiflow::testsupport {

class RawSegment {
 public:
  explicit RawSegment(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR);
    if (fd_ < 0) return;
    void* p = ::mmap(nullptr, sizeof(schedcache::Segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p != MAP_FAILED) segment_ = static_cast<schedcache::Segment*>(p);
  }
  ~RawSegment() {
    if (segment_ != nullptr) ::munmap(segment_, sizeof(schedcache::Segment));
    if (fd_ >= 0) ::close(fd_);
  }
  RawSegment(const RawSegment&) = delete;
  RawSegment& operator=(const RawSegment&) = delete;
  schedcache::Segment* operator->() const { return segment_; }
  bool ok() const { return segment_ != nullptr; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  schedcache::Segment* segment_ = nullptr;
};

}  // namespace optiflow::testsupport
