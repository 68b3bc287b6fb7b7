#pragma once
// Storage: one device allocation shared by every view of it.
#include <cstddef>
#include <cstdint>

#include "forge/core/allocator.h"
#include "forge/core/device.h"

namespace forge {

class Storage {
 public:
  // Allocates `nbytes` from `allocator` (on allocator->device()).
  Storage(size_t nbytes, Allocator* allocator);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  Allocator* allocator() const { return allocator_; }
  // Bumped by every in-place write, so autograd can tell a saved tensor was modified.
  uint64_t version() const { return version_; }
  void bump_version() { ++version_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;
  uint64_t version_ = 0;
};

}  // namespace forge
