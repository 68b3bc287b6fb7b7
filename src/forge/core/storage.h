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

  // Note [released storage] (ZeRO-3's sharded parameters): release() gives the memory back to
  // the allocator but keeps this object, so every tensor and view over it (a parameter, the
  // copies autograd saved for backward) stays valid as a handle; reading one is an error until
  // reallocate() provides fresh memory of the same size, which the owner then refills. Neither
  // bumps the version: a refill restores the same values.
  void release();
  void reallocate();
  bool is_released() const { return released_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;
  uint64_t version_ = 0;
  bool released_ = false;
};

}  // namespace forge
